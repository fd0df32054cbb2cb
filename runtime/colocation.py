"""Colocation profiling (`tvmsched profile-coloc`): interference between candidate layers of two models.

For a pair of candidate kernels (a of model A, b of model B) both loop on the device at once; a's
overhead per unit time is (co-located latency of a - isolated latency of a) / overlap time, and
the overlap is a's whole co-located run since b keeps running throughout. Each model contributes
the candidates of its heaviest layer (its largest isolated latency), so the table covers every
pair of unit counts. Pairs never profiled use ColocationTable.fallback.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from tvmsched.runtime.executor import Executor
from tvmsched.runtime.scheduler import ColocationTable


def _heaviest_layer(executor: Executor) -> int:
    layers = executor.manifest.layers
    return max(range(len(layers)), key=lambda i: layers[i].candidates[0].latency_us or layers[i].flops)


def _loop(executor: Executor, layer: int, cand: int, stop: threading.Event, times: list[float]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        executor.run_layer(layer, cand)
        executor.synchronize()
        times.append(time.perf_counter() - start)


def _isolated_s(executor: Executor, layer: int, cand: int, seconds: float) -> float:
    stop, times = threading.Event(), []
    thread = threading.Thread(target=_loop, args=(executor, layer, cand, stop, times))
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join()
    return float(np.median(times[1:] or times))


def profile_pair(a: Executor, b: Executor, seconds: float = 0.3) -> list[dict]:
    """Overhead per unit time of every (candidate of a's heaviest layer, candidate of b's heaviest layer), both ways."""
    la, lb = _heaviest_layer(a), _heaviest_layer(b)
    for executor in (a, b):
        executor.set_inputs(executor.random_inputs(0))
    rows = []
    for ca in range(len(a.manifest.layers[la].candidates)):
        for cb in range(len(b.manifest.layers[lb].candidates)):
            iso = {"a": _isolated_s(a, la, ca, seconds), "b": _isolated_s(b, lb, cb, seconds)}
            stop, times = threading.Event(), {"a": [], "b": []}
            threads = [threading.Thread(target=_loop, args=(a, la, ca, stop, times["a"])),
                       threading.Thread(target=_loop, args=(b, lb, cb, stop, times["b"]))]
            for thread in threads:
                thread.start()
            time.sleep(seconds)
            stop.set()
            for thread in threads:
                thread.join()
            co = {k: float(np.median(v[1:] or v)) for k, v in times.items()}
            for first, _second, (ex1, l1, c1), (ex2, l2, c2) in (("a", "b", (a, la, ca), (b, lb, cb)), ("b", "a", (b, lb, cb), (a, la, ca))):
                rows.append({
                    "first": _key(ex1, l1, c1), "second": _key(ex2, l2, c2),
                    "isolated_us": iso[first] * 1e6, "colocated_us": co[first] * 1e6,
                    "overhead_per_unit_time": max(0.0, (co[first] - iso[first]) / co[first]),
                })
    return rows


def _key(executor: Executor, layer: int, cand: int) -> str:
    return f"{executor.manifest.model_name}/{executor.manifest.layers[layer].candidates[cand].kernel}"


def profile(artifacts: list[str], device: str = "cpu", seconds: float = 0.3) -> list[dict]:
    """Profile every pair of the given artifacts."""
    executors = [Executor(path, device) for path in artifacts]
    rows = []
    for i in range(len(executors)):
        for j in range(i + 1, len(executors)):
            rows += profile_pair(executors[i], executors[j], seconds)
    return rows


def save(rows: list[dict], path: str | Path) -> None:
    Path(path).write_text(json.dumps(rows, indent=1))


def load_table(path: str | Path, total_units: int) -> ColocationTable:
    """A ColocationTable from `tvmsched profile-coloc --out` rows."""
    return table_from_rows(json.loads(Path(path).read_text()), total_units)


def table_from_rows(rows: list[dict], total_units: int) -> ColocationTable:
    return ColocationTable(total_units, {(r["first"], r["second"]): r["overhead_per_unit_time"] for r in rows})


def device_name(device: str) -> str:
    """The key profiles are stored under: the CPU model or the GPU's name."""
    import platform

    if device == "cuda":
        from tvmsched.runtime import native

        return str(native.device_info("cuda")["name"])
    return f"cpu:{platform.processor() or platform.machine()}"
