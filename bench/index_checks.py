"""What the run-time index bounds checks cost (issue 12 item 1): each model compiled twice, with
and without `--index-checks`, both loaded in one process and timed in alternating rounds (the
engine's whole-model timer, device-synchronised), so machine noise hits both sides alike.

    python bench/index_checks.py --out bench/results/raw/index_checks_cpu.json [--rounds 15 --repeat 20]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np

MODELS = ("bert-tiny-ids", "dlrm-small", "bert-tiny")  # bert-tiny: no run-time indices, a control


def measure(name: str, target: str, rounds: int, repeat: int) -> dict:
    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.runtime import Executor

    model = models.build(name)
    device = "cuda" if "cuda" in target else "cpu"
    sides = {}
    for checked in (True, False):
        artifact = compile_model(model, name=name, target=target, index_checks=checked)
        sides[checked] = (Executor(artifact, device=device), artifact.manifest)
    inputs = models.random_inputs(model, seed=0)
    outputs = {checked: executor.run(inputs) for checked, (executor, _) in sides.items()}
    for key in outputs[True]:
        np.testing.assert_array_equal(outputs[True][key], outputs[False][key])  # same kernels around the checks
    times = {True: [], False: []}
    for _ in range(rounds):
        for checked, (executor, _) in sides.items():
            times[checked] += executor.time_runs(inputs, repeat)
    p50 = {checked: float(np.median(t)) * 1e6 for checked, t in times.items()}
    return {
        "model": name,
        "index_checks": len(sides[True][1].index_checks),
        "layers_checked": len(sides[True][1].layers),
        "layers_unchecked": len(sides[False][1].layers),
        "p50_us_checked": round(p50[True], 1),
        "p50_us_unchecked": round(p50[False], 1),
        "p99_us_checked": round(float(np.percentile(times[True], 99)) * 1e6, 1),
        "p99_us_unchecked": round(float(np.percentile(times[False], 99)) * 1e6, 1),
        "ratio_p50": round(p50[True] / p50[False], 3),
        "runs_per_side": len(times[True]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--target", default="llvm")
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        row = measure(name, args.target, args.rounds, args.repeat)
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "target": args.target,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
