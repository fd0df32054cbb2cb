"""Dynamic batching in the engine Runtime against none (issue 39's benchmark, in-process path): per model, the highest
Poisson arrival rate at which the p99 latency stays within the model's latency target (20x its batch-1 p50 alone)
with at most 1% of the requests refused or failed.

    python bench/batching.py [--models mlp:8,resnet18-small:4,bert-tiny:4] [--seconds 3] [--out bench/results/raw/batching.json]

Per model two artifacts compiled here: as the zoo builds it (one row per run: "none") and for B rows
(`compile_model(batch_size=B)`: the engine Runtime packs the queued requests that fit into one launch, "batching").
The load is the engine's C++ open-loop generator (`tvmsched.engine.open_loop`: Poisson arrivals of one-row requests
submitted from a C++ thread, each latency from its scheduled arrival). The rate search starts at half the model's
batch-1 capacity and grows by 1.25x while both ways meet the target, the two ways run in turn at every step
(side by side), then each way's last good rate is refined by bisection. Padding waste: the share of the rows run
that no request brought (1 - requests / (executions x B)).
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


def artifacts(work: Path, name: str, size: int) -> tuple[Path, Path]:
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    work.mkdir(parents=True, exist_ok=True)
    paths = []
    for batch in (None, size):
        path = work / f"{name}-b{batch or 1}.tvms"
        if not path.exists():
            compile_model(models.build(name), name=name, batch_size=batch).save(path)
        paths.append(path)
    return paths[0], paths[1]


def alone_p50_us(path: Path, runs: int = 200) -> float:
    from tvmsched.runtime import Executor

    executor = Executor(str(path))
    inputs = executor.random_inputs(0)
    for _ in range(20):
        executor.run(inputs)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        executor.run(inputs)
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


DELAY_US = {"value": 0.0}  # --max-queue-delay-us: the batching way's queue delay (its streams wait for full batches)


def trial(path: Path, name: str, rate: float, seconds: float, seed: int) -> dict:
    """One open-loop run at `rate` per second on a fresh Runtime: p99 latency and refusals."""
    from tvmsched.runtime import Executor, native
    from tvmsched.runtime.executor import to_engine

    rt = native.create_runtime({"policy": "fastest"})
    try:
        rt.load(str(path), {"warmup": True, "max_queue_delay_us": DELAY_US["value"]})
        one_row = {k: v[:1].copy() for k, v in Executor(str(path)).random_inputs(0).items()}
        result = native.func("open_loop")(rt, name, to_engine(one_row), float(rate), float(seconds), int(seed))
        stats = rt.stats()[name]
    finally:
        rt.shutdown()
    latencies = np.asarray(list(result["latencies_us"]), dtype=np.float64)
    sent = len(latencies) + int(result["failed"]) + int(result["refused"])
    return {"rate": rate, "requests": sent, "p50_us": float(np.percentile(latencies, 50)) if len(latencies) else None,
            "p99_us": float(np.percentile(latencies, 99)) if len(latencies) else None,
            "lost": (sent - len(latencies)) / max(sent, 1), "generator_late_p99_us": float(result["late_us"]),
            "executions": int(stats["executions"]), "engine_requests": int(stats["requests"])}


def meets(result: dict, target_us: float) -> bool:
    return result["p99_us"] is not None and result["p99_us"] <= target_us and result["lost"] <= 0.01


def search(ways: dict[str, Path], name: str, target_us: float, start: float, seconds: float, seed: int) -> dict:
    """Both ways in turn at each rate while either meets the target, then each refined by bisection."""
    trials = {way: [] for way in ways}
    best = {way: None for way in ways}
    failed_at = {way: None for way in ways}
    rate = start
    while any(failed_at[w] is None for w in ways) and rate < start * 200:
        for way, path in ways.items():
            if failed_at[way] is not None:
                continue
            result = trial(path, name, rate, seconds, seed)
            trials[way].append(result)
            print(json.dumps({"model": name, "way": way, **{k: (round(v, 1) if isinstance(v, float) else v)
                                                           for k, v in result.items()}}), flush=True)
            if meets(result, target_us):
                best[way] = rate
            else:
                failed_at[way] = rate
        rate *= 1.25
    for way, path in ways.items():  # bisection between the last good rate and the first bad one
        low, high = best[way] or 0.0, failed_at[way] or rate
        for _ in range(3):
            middle = (low + high) / 2
            result = trial(path, name, middle, seconds, seed)
            trials[way].append(result)
            low, high = (middle, high) if meets(result, target_us) else (low, middle)
        best[way] = low
    return {"best_rate": best, "trials": trials}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="mlp:8,resnet18-small:4,bert-tiny:4", help="NAME:B,...")
    parser.add_argument("--seconds", type=float, default=3.0, help="per trial")
    parser.add_argument("--work", type=Path, default=Path("build/bench-batching"))
    parser.add_argument("--max-queue-delay-us", type=float, default=0.0,
                        help="the batching way's queue delay (0: it launches what is queued at once)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    DELAY_US["value"] = args.max_queue_delay_us
    report = {"machine": _common.machine_info(), "load_average": os.getloadavg(), "date": time.strftime("%Y-%m-%d %H:%M"),
              "command": " ".join(sys.argv), "models": {}}
    for item in args.models.split(","):
        name, size = item.split(":")
        plain, batched = artifacts(args.work, name, int(size))
        p50 = alone_p50_us(plain)
        target = 20 * p50
        found = search({"none": plain, "batching": batched}, name, target, 0.5e6 / p50, args.seconds, seed=1)
        last = [t for t in found["trials"]["batching"] if meets(t, target)]
        waste = None
        if last:
            t = last[-1]
            runs = t["executions"] * int(size)
            waste = 1 - t["engine_requests"] / runs if runs else None
        none, batching = found["best_rate"]["none"], found["best_rate"]["batching"]
        report["models"][name] = {"batch_size": int(size), "alone_p50_us": p50, "target_us": target,
                                  "best_rate_none": none, "best_rate_batching": batching,
                                  "ratio": batching / none if none else None, "padding_waste": waste,
                                  "trials": found["trials"]}
        print(json.dumps({"model": name, "alone_p50_us": round(p50, 1), "target_ms": round(target / 1e3, 2),
                          "rate_none": round(none or 0, 1), "rate_batching": round(batching or 0, 1),
                          "ratio": round(batching / none, 2) if none else None,
                          "padding_waste": round(waste, 3) if waste is not None else None}), flush=True)
    report["load_average_after"] = os.getloadavg()
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
