"""Colocation benchmark: several models with Poisson arrivals under four policies.

    python bench/colocation.py --artifacts a.tvms b.tvms --qos-ms 60 400 --rates 2 4 8 --seconds 10 \
        --out bench/results/raw/colocation_cpu.json
Per policy and total arrival rate (split evenly over the models): QoS violations, p99 latency, throughput,
and the scheduler's decision time; then the highest rate each policy sustains with <= 1% violations. `--search N`
then narrows each policy's rate by N bisection steps between its highest rate within 1% and the lowest above it
that is not (0 when none is within), so the highest sustained rate is not just a point of the grid.
Policies: colocation (the layer scheduler, with the --colocation profile if given), fcfs (time-sharing),
fastest (concurrent streams with the fastest candidates), partition (static even split of the units),
colocation-noprofile (the layer scheduler on the fallback rule alone).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from tvmsched.artifact.format import Artifact
from tvmsched.runtime import Runtime

POLICIES = ["colocation", "fcfs", "fastest", "partition"]
NO_PROFILE = "colocation-noprofile"  # the layer scheduler with the fallback rule only (beside --colocation runs)


def run(artifacts: list[Path], qos_ms: list[float], policy: str, rate: float, seconds: float, device: str, seed: int,
        colocation: str | None = None) -> dict:
    rt = Runtime(device, policy="colocation" if policy == NO_PROFILE else policy,
                 colocation=None if policy == NO_PROFILE else colocation)
    # loaded under their own model names: the profile's keys are MODEL/KERNEL (a second copy of a model gets m<i>, and
    # the fallback rule; before, every model was m<i> and no profile row ever matched)
    handles, names = [], set()
    for i, (path, q) in enumerate(zip(artifacts, qos_ms)):
        name = Artifact.load(path).manifest.model_name
        handles.append(rt.load(path, qos_ms=q, name=name if name not in names else f"m{i}"))
        names.add(handles[-1].name)
    inputs = [h.task.executor.random_inputs(i) for i, h in enumerate(handles)]
    for handle, x in zip(handles, inputs):  # warm-up
        rt.submit(handle, x).result()
    arrivals = poisson_arrivals(len(handles), rate, seconds, seed)
    before = rt.stats()  # the warm-up's requests are left out of the counts below
    start = time.perf_counter()
    drive(rt, handles, inputs, arrivals)
    elapsed = time.perf_counter() - start
    stats = rt.stats()
    rt.shutdown()
    requests = sum(stats[h.name]["requests"] - before[h.name]["requests"] for h in handles)
    violations = sum(stats[h.name]["qos_violations"] - before[h.name]["qos_violations"] for h in handles)
    return {
        "policy": policy, "rate": rate, "requests": requests, "violations": violations,
        "violation_rate": violations / max(requests, 1), "throughput": requests / elapsed,
        "violations_by_model": {h.name: stats[h.name]["qos_violations"] - before[h.name]["qos_violations"] for h in handles},
        "p99_ms": {h.name: stats[h.name]["p99_ms"] for h in handles},
        "decision_p50_us": stats["_scheduler"]["p50_us"], "decision_p99_us": stats["_scheduler"]["p99_us"],
    }


def poisson_arrivals(models: int, rate: float, seconds: float, seed: int) -> list[tuple[float, int]]:
    """(time s, model index) of Poisson arrivals of `rate` requests/s in all, split evenly over `models`, in order."""
    rng = np.random.default_rng(seed)
    return sorted((t, i) for i in range(models)
                  for t in np.cumsum(rng.exponential(models / rate, size=int(seconds * rate) + 20)) if t < seconds)


def drive(rt, handles, inputs, arrivals: list[tuple[float, int]]) -> None:
    """Submit each arrival at its time (from now) and wait for every result."""
    start, futures = time.perf_counter(), []
    for at, i in arrivals:
        delay = start + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        futures.append(rt.submit(handles[i], inputs[i]))
    for future in futures:
        future.result()


WITHIN = 0.01  # a rate is sustained with at most this share of QoS violations


def search(runs: list[dict], policy: str, steps: int, measure) -> list[dict]:
    """Bisect `policy`'s highest sustained rate between its runs' highest rate within WITHIN and the lowest rate above
    it that is not; `measure(rate)` runs one point. Nothing to narrow when every rate was within."""
    mine = [r for r in runs if r["policy"] == policy]
    low = max([r["rate"] for r in mine if r["violation_rate"] <= WITHIN], default=0.0)
    high = min([r["rate"] for r in mine if r["violation_rate"] > WITHIN and r["rate"] > low], default=None)
    done = []
    for _ in range(steps if high is not None else 0):
        rate = round((low + high) / 2, 1)
        if rate in (low, high):
            break
        done.append(measure(rate))
        if done[-1]["violation_rate"] <= WITHIN:
            low = rate
        else:
            high = rate
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, nargs="+", required=True)
    parser.add_argument("--qos-ms", type=float, nargs="+", required=True)
    parser.add_argument("--rates", type=float, nargs="+", required=True, help="Total requests per second.")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--policies", nargs="+", default=POLICIES, choices=[*POLICIES, NO_PROFILE])
    parser.add_argument("--colocation", help="A `tvmsched profile-coloc` profile of this device: a tuning-database URL, "
                        "or the JSON file of `profile-coloc --no-store --out`.")
    parser.add_argument("--search", type=int, default=0, metavar="N",
                        help="N bisection steps per policy after the rates, for its highest rate within 1%% violations")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"machine": f"{platform.machine()}, {platform.node()}", "device": args.device, "qos_ms": args.qos_ms,
              "colocation_profile": args.colocation,
              "artifacts": [str(a) for a in args.artifacts], "runs": []}
    for rate in args.rates:
        for policy in args.policies:
            result = run(args.artifacts, args.qos_ms, policy, rate, args.seconds, args.device, seed=int(rate * 10),
                         colocation=args.colocation)
            report["runs"].append(result)
            print(json.dumps(result), flush=True)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(report, indent=1))
    for policy in args.policies:
        for result in search(report["runs"], policy, args.search,
                             lambda rate, policy=policy: run(args.artifacts, args.qos_ms, policy, rate, args.seconds,
                                                             args.device, seed=int(rate * 10), colocation=args.colocation)):
            report["runs"].append(result)
            print(json.dumps(result), flush=True)
            if args.out:
                args.out.write_text(json.dumps(report, indent=1))
    sustained = {p: max([r["rate"] for r in report["runs"] if r["policy"] == p and r["violation_rate"] <= WITHIN], default=0.0)
                 for p in args.policies}
    report["max_rate_at_1pct_violations"] = sustained
    print(json.dumps(sustained))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
