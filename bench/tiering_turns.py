"""Streamed models taking turns (docs/tiering.md, "Several streamed models: turns"), side by side in one process.

    python bench/tiering_turns.py out/resnet18.tvms --budget 0.965 [--copies 2] [--requests 40] [--rounds 5]

The case that found it (issue 38): two copies of resnet18 (63.0 MB each) in a budget of 60.8 MB (0.965 x one's
footprint): before turns the second failed to load. Per round, interleaved: requests back to back on one copy (its
turn never ends: the streaming cost alone) and alternating between the copies (every request a turn change: park the
other, unpark this one, stream again from the first group); the difference is the cost of a turn. Weights in DRAM.
Prints a Markdown table (medians over the rounds).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("artifact")
    parser.add_argument("--budget", type=float, default=0.965, help="the budget as a fraction of one copy's footprint")
    parser.add_argument("--copies", type=int, default=2)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from tvmsched.runtime import Runtime
    from tvmsched.runtime.executor import Executor
    from tvmsched.runtime.switching import footprint_of
    from tvmsched.runtime.tiering import TierSettings

    inputs = Executor(args.artifact).random_inputs(0)
    need = footprint_of(args.artifact, 8)
    budget = int(need * args.budget)
    topology = {"gpus": [{"id": 0, "memory_bytes": 1}], "tiers": [{"kind": "dram", "capacity_bytes": 1 << 40}]}
    with Runtime("cpu", memory_budget=budget, tiering=TierSettings(topology=topology)) as rt:
        models = [rt.load(args.artifact, name=f"copy{i}") for i in range(args.copies)]
        want = rt.submit(models[0], inputs).result(timeout=600)

        def per_request(order) -> float:
            start = time.perf_counter()
            for model in order:
                got = rt.submit(model, inputs).result(timeout=600)
                assert all((got[k] == want[k]).all() for k in want), "outputs differ"
            return (time.perf_counter() - start) / len(order) * 1e3

        same, alternating = [], []
        for _ in range(args.rounds):
            same.append(per_request([models[0]] * args.requests))
            alternating.append(per_request([models[i % args.copies] for i in range(args.requests)]))
        turns = [e for e in rt.tier_events() if e.stage == "unpark"]
        unpark_ms = statistics.median((e.end_us - e.start_us) / 1e3 for e in turns)
        info = rt.tiering(models[0])
        assert rt.memory()["peak"] <= budget
    s, a = statistics.median(same), statistics.median(alternating)
    print(f"{datetime.date.today()} · {platform.processor() or platform.machine()}, {os.cpu_count()} cores · load "
          f"{os.getloadavg()[0]:.2f} · {args.artifact}: footprint {need / 1e6:.1f} MB, budget {budget / 1e6:.1f} MB, "
          f"{args.copies} copies, each {info['device_bytes'] / 1e6:.1f} MB of device memory "
          f"({info['resident_weight_bytes'] / 1e6:.1f} MB resident weights), {len(turns)} turns taken")
    print()
    print("| one copy back to back (ms/request) | copies alternating (ms/request) | a turn change (ms) | unpark alone (ms) |")
    print("|---|---|---|---|")
    print(f"| {s:.2f} | {a:.2f} | {a - s:.2f} | {unpark_ms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
