"""Dynamic batching in the engine Runtime against none (issue 39's benchmark, in-process path): per model, the highest
Poisson arrival rate at which the p99 latency stays within the model's latency target (20x its batch-1 p50 alone)
with at most 1% of the requests refused or failed.

    python bench/batching.py [--models mlp:1/2/4/8/16,resnet18-small:1/2/4/8,bert-tiny:1/2/4] [--seconds 3]
        [--out bench/results/raw/batching.json]

Per model two artifacts compiled here: as the zoo builds it (one row per run: "none") and at the batch sizes given
(`compile_model(batch_size=[...])`, one artifact: the engine Runtime packs the queued requests into one launch at the
size its batcher chooses from the sizes' runs measured at load, "batching"). Both ways are loaded with the latency
target as their qos_ms (admission and the batcher's deadline use it).
The load is the engine's C++ open-loop generator (`tvmsched.engine.open_loop`: Poisson arrivals of one-row requests
submitted from a C++ thread, each latency from its scheduled arrival). The rate search starts at half the model's
batch-1 capacity and grows by 1.25x while both ways meet the target, the two ways run in turn at every step
(side by side), then each way's last good rate is refined by bisection. A rate fails a way only when a second run
(another seed) fails too, the same rule for both ways: on a shared 2-core VM one stall decides a p99.
`--refresh-sizes` adds a third way, the batching artifact loaded with `refresh_sizes=True` (the sizes' figures
following the launches). Padding waste: the share of the rows run that no request brought (1 - rows brought / rows
run, from the engine's batch statistics and launches per size).

Also per model, the **capacity** of each way, where a p99 target on a shared 2-core VM is at the mercy of its stalls:
one-row requests arriving at 3x the batch-1 rate the model sustains alone for 1 s, loaded without a latency target
(so admission refuses nothing and the batcher compares the sizes by time per row alone), the rows answered per second
(requests / (1 s + the last request's latency): the queue drains at the way's capacity); `--rounds` runs each (3),
the ways in turn, the median.

**A co-tenant after the load** (`--co-tenant HOGS`, instead of the rest): the first model's batching artifact loaded on
a quiet machine with a latency target (`--co-tenant-qos-ms`, 2), then HOGS busy processes start beside it and one-row
Poisson requests arrive (`--co-tenant-rate`, 8000/s, `--seconds`); the sizes' figures kept as measured at load
against following the launches (`refresh_sizes`), in turn for `--rounds` rounds: the share answered past the target
and refused, the p50, the figures before and after.

**Through the server** (`--serve`, the issue's second path, reported): each way served by `tvmsched serve` from a
Triton-layout repository (config.pbtxt with dynamic_batching for the batching way), 16 tritonclient gRPC clients in
threads, closed loop, one row each, 3 s per run, the ways in turn twice: rows answered per second and the client's p99.
The Python clients share the 2 cores with the server, so this is what a user sees on this machine, not the server's
capacity.

**The three-model mix** (`--mix`, the issue's last goal, reported on CPU): mlp, resnet18-small and bert-tiny, each
compiled at its sizes (`--mix-models`) from one database of CPU kits measured here at 1 and 2 threads (a kit per
size), two ways: "units" (every layer's 1- and 2-thread candidates: the colocation policy chooses the batch size and
the units together) and "full" (the 2-thread, all-units candidates only: batching with full-unit kernels). Both on one
engine Runtime with the colocation policy, each model's latency target 20x its batch-1 p50 alone. The load is one
merged Poisson stream (`tvmsched.engine.open_loop_mix`), each model at `scale` x a third of its batch-1 rate alone;
the same search as above on `scale` (both ways in turn, a failure confirmed by a second run, bisection), a scale
meeting when every model's p99 is within its target with <= 1% refused or failed. The ratio: units' best scale over
full's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402


DELAY_US = {"value": 0.0}  # --max-queue-delay-us: the batching way's queue delay (its streams wait for full batches)
REFRESH = "batching-refresh"  # --refresh-sizes: the batching way again, its sizes' figures following the launches
DEVICE = {"value": "cpu"}  # --device: cpu, or cuda (docs/gpu.md's plan, step 5: artifacts carried into --work)


def artifacts(work: Path, name: str, sizes: list[int]) -> tuple[Path, Path]:
    from tvmsched import models

    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for batch in (None, sizes):
        path = work / f"{name}-b{'-'.join(map(str, batch)) if batch else 'none'}.tvms"
        if not path.exists():  # compiled here; on the GPU machine (no compiler) carried into --work under these names
            from tvmsched.pipeline import compile_model

            compile_model(models.build(name), name=name, batch_size=batch,
                          target="cuda" if DEVICE["value"] == "cuda" else "llvm").save(path)
        paths.append(path)
    return paths[0], paths[1]


def alone_p50_us(path: Path, runs: int = 200) -> float:
    from tvmsched.runtime import Executor

    executor = Executor(str(path), DEVICE["value"])
    inputs = executor.random_inputs(0)
    for _ in range(20):
        executor.run(inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        executor.run(inputs)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def latency_summary(result) -> dict:
    """An open loop's answer for one model: requests sent, latency p50 / p99 / max (µs), the share refused or failed."""
    latencies = np.asarray(list(result["latencies_us"]), dtype=np.float64)
    sent = len(latencies) + int(result["failed"]) + int(result["refused"])
    return {"requests": sent, "p50_us": float(np.percentile(latencies, 50)) if len(latencies) else None,
            "p99_us": float(np.percentile(latencies, 99)) if len(latencies) else None,
            "max_us": float(latencies.max()) if len(latencies) else 0.0, "lost": (sent - len(latencies)) / max(sent, 1)}


def trial(path: Path, name: str, rate: float, seconds: float, seed: int, target_us: float | None,
          refresh: bool = False) -> dict:
    """One open-loop run at `rate` per second on a fresh Runtime (`target_us` its qos_ms; None: no latency target, so
    admission refuses nothing; `refresh`: the sizes' figures follow the launches, else they stay as measured at load):
    p99 latency and refusals."""
    from tvmsched.runtime import Executor, native
    from tvmsched.runtime.executor import to_engine

    rt = native.create_runtime({"policy": "fastest", "device": DEVICE["value"]})
    try:
        rt.load(str(path), {"warmup": True, "max_queue_delay_us": DELAY_US["value"], "refresh_sizes": refresh,
                            **({"qos_ms": target_us / 1e3} if target_us else {})})
        one_row = {k: v[:1].copy() for k, v in Executor(str(path), DEVICE["value"]).random_inputs(0).items()}
        result = native.func("open_loop")(rt, name, to_engine(one_row), float(rate), float(seconds), int(seed))
        stats = rt.stats()[name]
    finally:
        rt.shutdown()
    return {"rate": rate, **latency_summary(result), "generator_late_p99_us": float(result["late_us"]),
            "executions": int(stats["executions"]),
            "rows_brought": sum(int(rows) * int(count) for rows, count, _ in stats["batches"]),
            "rows_run": sum(int(size) * int(launches) for size, _, launches in stats["sizes"]),
            "launches_per_size": {str(int(size)): int(launches) for size, _, launches in stats["sizes"]},
            "size_run_us": {str(int(size)): round(float(us), 1) for size, us, _ in stats["sizes"]}}


def capacity(ways: dict[str, Path], name: str, p50_us: float, target_us: float, seed: int,
             rounds: int = 3) -> dict[str, float]:
    """Rows answered per second by each way under overload (3x the batch-1 rate alone for 1 s), median of `rounds`
    in turn."""
    rate, seconds, runs = 3e6 / p50_us, 1.0, {way: [] for way in ways}
    for attempt in range(rounds):
        for way, path in ways.items():
            result = trial(path, name, rate, seconds, seed + attempt, None, way == REFRESH)  # no target: none refused
            answered = result["requests"] * (1 - result["lost"])
            runs[way].append(answered / (seconds + result["max_us"] / 1e6))
    return {way: statistics.median(values) for way, values in runs.items()}


def through_server(ways: dict[str, Path], name: str, work: Path, target_us: float) -> dict:
    """Each way served by `tvmsched serve` from a Triton-layout repository; 16 closed-loop gRPC clients, 3 s, in turn x2."""
    from concurrent.futures import ThreadPoolExecutor

    import tritonclient.grpc as grpcclient

    from tests.helpers import free_port, start_server, stop_server
    from tvmsched.runtime import Executor
    from tvmsched.serve.tensors import V2_TYPES

    out = {way: {"rows_per_s": [], "p99_ms": []} for way in ways}
    for _ in range(2):
        for way, path in ways.items():
            root = work / f"repo-{name}-{way}"
            folder = root / name
            (folder / "1").mkdir(parents=True, exist_ok=True)
            (folder / "1" / "model.tvms").unlink(missing_ok=True)
            (folder / "1" / "model.tvms").symlink_to(path.resolve())
            manifest = Executor(str(path), DEVICE["value"]).manifest
            batching = "\ndynamic_batching { }" if manifest.batch_size else ""
            (folder / "config.pbtxt").write_text(
                f'name: "{name}"\nbackend: "tvmsched"\nmax_batch_size: {manifest.batch_size or 0}{batching}\n'
                f'parameters {{ key: "qos_ms" value: {{ string_value: "{target_us / 1e3:.3f}" }} }}\n')
            http, grpc = free_port(), free_port()
            server = start_server([sys.executable, "-m", "tvmsched.cli", "serve", "--model-repository", str(root),
                                   "--port", str(http), "--grpc-port", str(grpc), "--max-queue", "256"],
                                  f"http://127.0.0.1:{http}", ready="/v2/health/ready")
            row = {k: v[:1] for k, v in Executor(str(path), DEVICE["value"]).random_inputs(0).items()}
            deadline, latencies = time.monotonic() + 3.0, []

            def client_loop() -> list[float]:
                client, mine = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}"), []
                tensors = []
                for key, value in row.items():
                    tensor = grpcclient.InferInput(key, list(value.shape), V2_TYPES[value.dtype])
                    tensor.set_data_from_numpy(value)
                    tensors.append(tensor)
                while time.monotonic() < deadline:
                    start = time.perf_counter()
                    client.infer(name, tensors)
                    mine.append(time.perf_counter() - start)
                client.close()
                return mine

            try:
                start = time.monotonic()
                with ThreadPoolExecutor(16) as pool:
                    for mine in pool.map(lambda _: client_loop(), range(16)):
                        latencies.extend(mine)
                elapsed = time.monotonic() - start
            finally:
                stop_server(server)
            out[way]["rows_per_s"].append(len(latencies) / elapsed)
            out[way]["p99_ms"].append(float(np.percentile(latencies, 99)) * 1e3)
    return {way: {k: statistics.median(v) for k, v in r.items()} for way, r in out.items()}



def co_tenant(path: Path, name: str, rate: float, qos_ms: float, hogs: int, rounds: int, seconds: float) -> dict:
    """The sizes' figures kept as measured at load against following the launches (refresh_sizes), when the machine
    changes after the load: the model is loaded on a quiet machine with a latency target, then `hogs` busy processes
    start (a co-tenant) and one-row Poisson requests arrive at `rate`; per way, in turn each round: the share of the
    requests answered past the target, the share refused, the p50, and the figures before and after."""
    import subprocess

    from tvmsched.runtime import Executor, native
    from tvmsched.runtime.executor import to_engine

    one_row = {k: v[:1].copy() for k, v in Executor(str(path), DEVICE["value"]).random_inputs(0).items()}
    out = {"refresh": [], "fixed": []}
    for round_ in range(rounds):
        for way in out:
            rt = native.create_runtime({"policy": "fastest", "device": DEVICE["value"]})
            busy = []
            try:
                rt.load(str(path), {"warmup": True, "qos_ms": qos_ms, "refresh_sizes": way == "refresh"})
                before = {int(s): round(float(us), 1) for s, us, _ in rt.stats()[name]["sizes"]}
                busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
                time.sleep(0.3)
                result = native.func("open_loop")(rt, name, to_engine(one_row), float(rate), seconds, 7 + round_)
                after = {int(s): round(float(us), 1) for s, us, _ in rt.stats()[name]["sizes"]}
            finally:
                for process in busy:
                    process.kill()
                    process.wait()
                rt.shutdown()
            summary = latency_summary(result)
            late = sum(us > qos_ms * 1e3 for us in result["latencies_us"])
            row = {"late": late / summary["requests"], "refused": int(result["refused"]) / summary["requests"],
                   "p50_us": summary["p50_us"], "before": before, "after": after}
            out[way].append(row)
            print(json.dumps({"co_tenant": way, "round": round_, **{k: round(v, 4) if isinstance(v, float) else v
                                                                     for k, v in row.items()}}), flush=True)
    return {way: {"late_median": statistics.median(r["late"] for r in rows),
                  "p50_median_us": statistics.median(r["p50_us"] for r in rows), "rounds": rows}
            for way, rows in out.items()}


def mix_artifacts(work: Path, sizes_of: dict[str, list[int]]) -> dict[str, dict[str, Path]]:
    """{way: {model: artifact}}: "units" with 1- and 2-thread candidates per layer, "full" with the 2-thread ones only,
    from one database per model of CPU kits measured here at 1 and 2 threads, a kit per batch size (cached in `work`)."""
    from tvmsched import models
    from tvmsched.frontend import batching
    from tvmsched.pipeline import compile_model
    from tvmsched.tune.kit_build import build_kit, import_results
    from tvmsched.tune.kit_run import measure_kit

    work.mkdir(parents=True, exist_ok=True)
    out = {"units": {}, "full": {}}
    for name, sizes in sizes_of.items():
        tag = "-".join(map(str, sizes))
        db = f"sqlite:///{work / f'{name}-mix-b{tag}.db'}"
        for way, units in (("units", None), ("full", [2])):
            path = work / f"{name}-mix-{way}-b{tag}.tvms"
            if not path.exists():
                for size in sizes:
                    kit = work / f"{name}-kit-b{size}"
                    if not (work / f"{name}-kit-b{size}.done").exists():
                        build_kit(batching.rebatch(models.build(name), size).model, kit, target="llvm", samples=2,
                                  progress=False)
                        import_results(kit, measure_kit(kit, [1, 2], repeat=2, progress=False), db)
                        (work / f"{name}-kit-b{size}.done").touch()
                compile_model(models.build(name), name=name, qos_ms=1000.0, database=db, units=units,
                              batch_size=sizes).save(path)
            out[way][name] = path
    return out


def mix_trial(paths: dict[str, Path], targets_us: dict[str, float], rates: dict[str, float], seconds: float,
              seed: int) -> dict:
    """One open-loop run of the mix on a fresh Runtime (colocation policy): per model p99 and refusals."""
    from tvmsched.runtime import Executor, native
    from tvmsched.runtime.executor import to_engine

    rt = native.create_runtime({"policy": "colocation", "device": DEVICE["value"]})
    try:
        inputs = []
        for name, path in paths.items():
            rt.load(str(path), {"name": name, "warmup": True, "qos_ms": targets_us[name] / 1e3})
            one = Executor(str(path), DEVICE["value"], batch_size=1).random_inputs(0)
            inputs.append(to_engine({k: v[:1].copy() for k, v in one.items()}))
        result = native.func("open_loop_mix")(rt, list(paths), inputs, [float(rates[n]) for n in paths], float(seconds),
                                              int(seed))
        stats = rt.stats()
    finally:
        rt.shutdown()
    out = {}
    for name in paths:
        out[name] = {"rate": rates[name], **latency_summary(result[name]),
                     "launches_per_size": {str(int(size)): int(n) for size, _, n in stats[name]["sizes"]}}
    out[""] = {"generator_late_p99_us": float(result[""]["late_us"])}
    return out


def search_ways(ways, start: float, attempt) -> dict:
    """Each way's highest value (a rate, or the mix's scale) meeting its targets: from `start`, x1.25 while any way
    still meets, the ways in turn at every step (side by side), then 3 bisection steps per way between its last good
    value and its first bad one. `attempt(way, value, seed_offset) -> bool` runs one trial; a value fails a way only
    when a second run (another seed) fails too: on a shared 2-core VM one stall decides a p99."""
    def holds(way, value) -> bool:
        return any(attempt(way, value, offset) for offset in range(2))  # (the second only after a failure)

    best, failed_at, value = {way: None for way in ways}, {way: None for way in ways}, start
    while any(failed_at[w] is None for w in ways) and value < start * 200:
        for way in ways:
            if failed_at[way] is None:
                if holds(way, value):
                    best[way] = value
                else:
                    failed_at[way] = value
        value *= 1.25
    for way in ways:
        low, high = best[way] or 0.0, failed_at[way] or value
        for _ in range(3):
            middle = (low + high) / 2
            low, high = (middle, high) if holds(way, middle) else (low, middle)
        best[way] = low
    return best


def mix_search(ways: dict[str, dict[str, Path]], targets_us: dict[str, float], capacity_per_s: dict[str, float],
               seconds: float, seed: int) -> dict:
    """Each way's best scale (every model at scale x a third of its batch-1 rate alone) meeting every target."""
    trials = {way: [] for way in ways}

    def attempt(way: str, scale: float, offset: int) -> bool:
        rates = {name: scale * capacity_per_s[name] / 3 for name in targets_us}
        result = mix_trial(ways[way], targets_us, rates, seconds, seed + offset)
        good = all(meets(r, targets_us[n]) for n, r in result.items() if n)
        trials[way].append({"scale": scale, "meets": good, **result})
        print(json.dumps({"mix": way, "scale": round(scale, 3), "meets": good,
                          **{n: {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}
                             for n, r in result.items()}}), flush=True)
        return good

    return {"best_scale": search_ways(ways, 0.5, attempt), "trials": trials}


def meets(result: dict, target_us: float) -> bool:
    return result["p99_us"] is not None and result["p99_us"] <= target_us and result["lost"] <= 0.01


def search(ways: dict[str, Path], name: str, target_us: float, start: float, seconds: float, seed: int) -> dict:
    """Both ways in turn at each rate while either meets the target, then each refined by bisection."""
    trials = {way: [] for way in ways}

    def attempt(way: str, rate: float, offset: int) -> bool:
        result = trial(ways[way], name, rate, seconds, seed + offset, target_us, way == REFRESH)
        trials[way].append(result)
        print(json.dumps({"model": name, "way": way, **{k: (round(v, 1) if isinstance(v, float) else v)
                                                       for k, v in result.items()}}), flush=True)
        return meets(result, target_us)

    return {"best_rate": search_ways(ways, start, attempt), "trials": trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp:1/2/4/8/16,resnet18-small:1/2/4/8,bert-tiny:1/2/4",
                        help="NAME:SIZE/SIZE/...,...")
    parser.add_argument("--seconds", type=float, default=3.0, help="per trial")
    parser.add_argument("--work", type=Path, default=Path("build/bench-batching"))
    parser.add_argument("--max-queue-delay-us", type=float, default=0.0,
                        help="the batching way's queue delay (0: it launches what is queued at once)")
    parser.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure through tvmsched serve with tritonclient (--no-serve: in process only)")
    parser.add_argument("--mix", action=argparse.BooleanOptionalAction, default=False,
                        help="also the three-model mix: the colocation policy choosing batch and units against "
                             "full-unit kernels only")
    parser.add_argument("--mix-models", default="mlp:1/4/16,resnet18-small:1/4,bert-tiny:1/2",
                        help="the mix's models and sizes, NAME:SIZE/SIZE/...,...")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="where the in-process ways run (cuda: the artifacts carried into --work, no compiler needed)")
    parser.add_argument("--refresh-sizes", action="store_true",
                        help=f"also the way {REFRESH!r}: the batching artifact loaded with refresh_sizes=True, in turn "
                             "with the others (the sizes' figures following the launches, against kept from the load)")
    parser.add_argument("--co-tenant", type=int, metavar="HOGS",
                        help="instead of the search: the first model's batching artifact loaded on a quiet machine, "
                             "then HOGS busy processes beside it, the sizes' figures kept against refreshed "
                             "(--co-tenant-rate, --co-tenant-qos-ms, --rounds)")
    parser.add_argument("--co-tenant-rate", type=float, default=8000.0)
    parser.add_argument("--co-tenant-qos-ms", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3, help="capacity runs per way, co-tenant rounds")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    DELAY_US["value"] = args.max_queue_delay_us
    DEVICE["value"] = args.device
    report = {"machine": _common.machine_info(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": " ".join(sys.argv), "models": {}}
    if args.co_tenant is not None:
        name, listed = args.models.split(",")[0].split(":")
        _, batched = artifacts(args.work, name, [int(size) for size in listed.split("/")])
        report["co_tenant"] = co_tenant(batched, name, args.co_tenant_rate, args.co_tenant_qos_ms, args.co_tenant,
                                        args.rounds, args.seconds)
        print(json.dumps({way: {k: round(v, 4) for k, v in r.items() if k != "rounds"}
                          for way, r in report["co_tenant"].items()}), flush=True)
        if args.out:
            _common.write_json_atomic(args.out, report)
        return
    for item in filter(None, args.models.split(",")):  # ("": the mix only)
        name, listed = item.split(":")
        sizes = [int(size) for size in listed.split("/")]
        plain, batched = artifacts(args.work, name, sizes)
        p50 = alone_p50_us(plain)
        target = 20 * p50
        ways = {"none": plain, "batching": batched, **({REFRESH: batched} if args.refresh_sizes else {})}
        found = search(ways, name, target, 0.5e6 / p50, args.seconds, seed=1)
        last = [t for t in found["trials"]["batching"] if meets(t, target)]
        waste = 1 - last[-1]["rows_brought"] / last[-1]["rows_run"] if last and last[-1]["rows_run"] else None
        none, batching = found["best_rate"]["none"], found["best_rate"]["batching"]
        rows_per_s = capacity(ways, name, p50, target, seed=11, rounds=args.rounds)
        served = through_server({"none": plain, "batching": batched}, name, args.work, target) if args.serve else None
        extra = {}
        if args.refresh_sizes:  # the same artifact, the sizes' figures following the launches
            kept = [t for t in found["trials"][REFRESH] if meets(t, target)]
            extra = {"best_rate_refresh": found["best_rate"][REFRESH],
                     "padding_waste_refresh": 1 - kept[-1]["rows_brought"] / kept[-1]["rows_run"] if kept else None}
        report["models"][name] = {"batch_sizes": sizes, "alone_p50_us": p50, "target_us": target, **extra,
                                  "best_rate_none": none, "best_rate_batching": batching,
                                  "ratio": batching / none if none else None, "padding_waste": waste,
                                  "capacity_rows_per_s": rows_per_s,
                                  "capacity_ratio": rows_per_s["batching"] / rows_per_s["none"],
                                  "through_server": served,
                                  "trials": found["trials"]}
        print(json.dumps({"model": name, "alone_p50_us": round(p50, 1), "target_ms": round(target / 1e3, 2),
                          "rate_none": round(none or 0, 1), "rate_batching": round(batching or 0, 1),
                          "ratio": round(batching / none, 2) if none else None,
                          **({k: round(v, 3) if isinstance(v, float) else v for k, v in extra.items()}),
                          "capacity": {k: round(v) for k, v in rows_per_s.items()},
                          "capacity_ratio": round(rows_per_s["batching"] / rows_per_s["none"], 2),
                          "through_server": served,
                          "padding_waste": round(waste, 3) if waste is not None else None,
                          "launches_per_size": last[-1]["launches_per_size"] if last else None}), flush=True)
    if args.mix:
        sizes_of = {item.split(":")[0]: [int(n) for n in item.split(":")[1].split("/")] for item in
                    args.mix_models.split(",")}
        ways = mix_artifacts(args.work, sizes_of)
        from tvmsched.runtime import Executor

        alone = {}
        for name, path in ways["units"].items():  # its batch-1 p50 alone at its fastest candidates
            executor, times = Executor(str(path), DEVICE["value"], batch_size=1), []
            inputs = executor.random_inputs(0)
            for _ in range(220):
                start = time.perf_counter()
                executor.run(inputs)
                times.append((time.perf_counter() - start) * 1e6)
            alone[name] = statistics.median(times[20:])
        targets = {name: 20 * p50 for name, p50 in alone.items()}
        found = mix_search(ways, targets, {name: 1e6 / p50 for name, p50 in alone.items()}, args.seconds, seed=21)
        units, full = found["best_scale"]["units"], found["best_scale"]["full"]
        report["mix"] = {"sizes": sizes_of, "alone_p50_us": alone, "targets_us": targets, "best_scale": found["best_scale"],
                         "ratio": units / full if full else None, "trials": found["trials"]}
        print(json.dumps({"mix": "result", "alone_p50_us": {k: round(v, 1) for k, v in alone.items()},
                          "best_scale": found["best_scale"], "ratio": round(units / full, 2) if full else None}),
              flush=True)
    report["load_average_after"] = os.getloadavg()
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
