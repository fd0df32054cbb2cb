"""Measuring switches (`tvmsched bench switch`, bench/switching.py): per model, the resident latency, the first
request after a switch-in with and without the environment kept, and a stop-and-start, side by side. A tool on top
of the runtime's switcher (runtime/switching.py), not part of the mechanism."""

from __future__ import annotations

import gc
import subprocess
import sys
import time
from dataclasses import asdict, replace

import numpy as np

from tvmsched.runtime import native
from tvmsched.errors import TvmschedError
from tvmsched.runtime.switching import SwitchSettings, footprint, groups


def _latency_ms(rt, name: str, inputs) -> float:
    """One request, submit to result, in ms (the same Python path for every variant)."""
    start = time.perf_counter()
    rt.submit(name, inputs).result(timeout=600)
    return (time.perf_counter() - start) * 1e3


def _stop_and_start_ms(path: str, device: str) -> float:
    """A fresh process that loads the artifact and runs it once (`tvmsched run`), spawn to exit."""
    start = time.perf_counter()
    # -P: the current folder does not shadow the installed package (from a source checkout's root, its tvmsched/
    # folder has no runtime/: on the H100 this step failed with "No module named 'tvmsched.runtime'")
    done = subprocess.run([sys.executable, "-P", "-m", "tvmsched.cli", "run", path, "--device", device, "--json"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise TvmschedError(f"stop-and-start of {path} failed: {(done.stderr or done.stdout).strip()[-300:]}")
    return (time.perf_counter() - start) * 1e3


def _median(values) -> float:
    return float(np.median(values))


def _probe(paths: list[str], device: str, settings: SwitchSettings, qos_ms: float | None) -> dict[str, dict]:
    """Per model (by name): its path, inputs, footprint, environment and weight bytes, sub-tasks and QoS."""
    from tvmsched.runtime import Executor

    probes = {}
    for path in paths:
        executor = Executor(path, device, register_groups=settings.max_groups)
        name = executor.manifest.model_name
        if name in probes:
            raise TvmschedError(f"two artifacts hold a model named {name!r}")
        probes[name] = {"path": str(path), "executor": executor, "inputs": executor.random_inputs(0),
                        "footprint": footprint(executor),
                        "env": int(executor.native.env_bytes()), "groups": len(groups(executor)),
                        "weight_bytes": sum(g["weight_bytes"] for g in groups(executor)),
                        "qos_ms": qos_ms or executor.manifest.qos_ms}
    return probes


def _measure_resident(device: str, probes: dict[str, dict], repeat: int) -> tuple[dict, dict]:
    """(d) and the floor: every model resident, no budget; per model its latencies alone and after another's."""
    from tvmsched.runtime import Runtime

    names = list(probes)
    with Runtime(device) as rt:
        for name in names:
            rt.load(probes[name]["path"])
        for name in names:
            _latency_ms(rt, name, probes[name]["inputs"])  # warm
        floor = {n: [] for n in names}
        after_other = {n: [] for n in names}
        for _ in range(repeat):
            for i, name in enumerate(names):
                floor[name].append(_latency_ms(rt, name, probes[name]["inputs"]))
                other = names[(i + 1) % len(names)]
                _latency_ms(rt, other, probes[other]["inputs"])
                after_other[name].append(_latency_ms(rt, name, probes[name]["inputs"]))
    return floor, after_other


def _measure_switches(device: str, probes: dict[str, dict], variant: SwitchSettings, budget: int,
                      repeat: int) -> tuple[dict, dict, int]:
    """Each measured request comes after its model was evicted (environment kept ahead: a switch; gone: cold,
    stage 1 included). Per model its warm and cold latencies, and the evictions recorded."""
    from tvmsched.runtime import Runtime

    names = list(probes)
    with Runtime(device, memory_budget=budget, switching=variant) as rt:
        for name in names:
            rt.load(probes[name]["path"], resident=False)
        cold, warm = {n: [] for n in names}, {n: [] for n in names}
        for _ in range(repeat):
            for name in names:  # each switch-in from evicted: environment gone (cold) or kept ahead (warm)
                for keep_env, out in ((False, cold), (True, warm)):
                    if not rt.evict(name, keep_environment=keep_env):
                        raise TvmschedError(f"could not evict {name} to measure its switch")
                    out[name].append(_latency_ms(rt, name, probes[name]["inputs"]))
        evictions = sum(e.stage == "evict" for e in rt.switch_events())
    return warm, cold, evictions


def _derive(row: dict, qos_ms: float | None) -> None:
    """A model's row: the switch overhead, against the copy floor and stop-and-start, and the QoS verdict."""
    row["switch_overhead_ms"] = row["switch_ms"] - row["resident_ms"]
    row["overhead_vs_copy_floor"] = row["switch_overhead_ms"] / row["copy_floor_ms"] if row["copy_floor_ms"] > 0 else None
    if "stop_and_start_ms" in row:
        row["stop_and_start_vs_switch"] = row["stop_and_start_ms"] / row["switch_ms"]
    row["qos_ms"] = qos_ms or 2 * row["resident_ms"]
    row["meets_qos_switched"] = row["switch_ms"] <= row["qos_ms"]


def measure_switching(paths: list[str], device: str = "cpu", repeat: int = 5, qos_ms: float | None = None,
                      settings: SwitchSettings = SwitchSettings(), stop_and_start: bool = True,
                      progress=lambda text: None) -> dict:
    """Per model, side by side: (floor) the resident latency, the first-request latency after a switch
    (pipelined, from evicted with its environment kept ahead; and cold, stage 1 included), (c) load-then-run without
    pipelining (one sub-task), (b) stop-and-start, (d) all models resident with no budget (MPS-like),
    and the copy floor (its weights from pinned host memory into device memory). Medians of `repeat`.
    The switching budget holds the largest model and every environment: each switch evicts."""
    if len(paths) < 2:
        raise TvmschedError("bench switch needs at least two artifacts (a switch goes from one model to another)")
    probes = _probe(paths, device, settings, qos_ms)
    names = list(probes)
    rows = {name: {"model": name, "sub_tasks": p["groups"], "weight_bytes": p["weight_bytes"], "footprint_bytes": p["footprint"]}
            for name, p in probes.items()}
    for name, p in probes.items():
        progress(f"copy floor: {name}")
        rows[name]["copy_floor_ms"] = float(native.copy_floor(p["executor"].native, max(repeat, 3))) * 1e3
    for p in probes.values():
        del p["executor"]
    gc.collect()

    floor, after_other = _measure_resident(device, probes, repeat)
    for name in names:
        rows[name]["resident_ms"] = _median(floor[name])
        rows[name]["all_resident_ms"] = _median(after_other[name])

    budget = max(p["footprint"] for p in probes.values()) + sum(p["env"] for p in probes.values()) + 65536
    variants = {"switch_ms": settings, "no_pipeline_ms": replace(settings, max_groups=1)}
    for key, variant in variants.items():
        progress(f"switching: {key.removesuffix('_ms').replace('_', ' ')}")
        variant = replace(variant, threshold1=max(variant.threshold1, sum(p["env"] for p in probes.values())))
        warm, cold, evictions = _measure_switches(device, probes, variant, budget, repeat)
        for name in names:
            rows[name][key] = _median(warm[name])
            if key == "switch_ms":
                rows[name]["cold_switch_ms"] = _median(cold[name])
                rows[name]["evictions"] = evictions
    if stop_and_start:
        for name in names:
            progress(f"stop-and-start: {name}")
            rows[name]["stop_and_start_ms"] = _median([_stop_and_start_ms(probes[name]["path"], device) for _ in range(2)])
    for name, row in rows.items():
        _derive(row, probes[name]["qos_ms"])
    # how many models one budget serves at the QoS: resident only (what fits) vs with switching
    fits, used = 0, 0
    for size in sorted(p["footprint"] for p in probes.values()):
        if used + size <= budget:
            fits, used = fits + 1, used + size
    return {"device": device, "device_name": str(native.device_info(device)["name"]), "budget_bytes": budget,
            "repeat": repeat, "settings": asdict(settings), "models": list(rows.values()),
            "served_resident_only": fits, "served_with_switching": sum(r["meets_qos_switched"] for r in rows.values())}


def format_switching(result: dict) -> str:
    """The measurement as a Markdown table."""
    lines = [f"device: {result['device_name']} ({result['device']}); budget {result['budget_bytes'] / 2**20:.1f} MiB "
             f"(the largest model + every environment); medians of {result['repeat']}",
             "",
             "| model | weights MiB | sub-tasks | resident ms | switch ms | overhead ms | copy floor ms | overhead / floor "
             "| cold switch ms | no pipelining ms | all resident ms | stop-and-start ms | stop-and-start / switch |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["models"]:
        sas = r.get("stop_and_start_ms")
        sas_ratio = "-" if sas is None else f"{r['stop_and_start_vs_switch']:.0f}x"
        lines.append(f"| {r['model']} | {r['weight_bytes'] / 2**20:.2f} | {r['sub_tasks']} | {r['resident_ms']:.3f} | "
                     f"{r['switch_ms']:.3f} | {r['switch_overhead_ms']:.3f} | {r['copy_floor_ms']:.3f} | "
                     f"{r['overhead_vs_copy_floor']:.2f} | {r['cold_switch_ms']:.3f} | {r['no_pipeline_ms']:.3f} | "
                     f"{r['all_resident_ms']:.3f} | {'-' if sas is None else f'{sas:.0f}'} | "
                     f"{sas_ratio} |")
    lines += ["", f"models served by this budget at their QoS: {result['served_resident_only']} resident only, "
                  f"{result['served_with_switching']} with switching"]
    return "\n".join(lines)
