"""GPU check of preemption: random preempt/resume cycles give bit-identical outputs (run on the GPU machine).

    python3 bench/gpu/preemption_check.py ARTIFACT_DIR --models mlp resnet18-small bert-tiny --cycles 200
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np


def check(path: Path, cycles: int, requests: int, seed: int = 0) -> dict:
    from tvmsched.runtime import Executor
    from tvmsched.runtime.preemption import Task

    executor = Executor(path, "cuda")
    inputs = executor.random_inputs(3)
    expected = Executor(path, "cuda").run(inputs)
    task = Task(executor, path.stem)
    futures = [task.submit(inputs) for _ in range(requests)]
    rng, seconds = random.Random(seed), []
    for _ in range(cycles):
        time.sleep(rng.uniform(0, 0.0005))
        seconds.append(task.preempt().seconds)
        task.resume()
    identical = all(all(np.array_equal(f.result(timeout=120)[k], expected[k]) for k in expected) for f in futures)
    task.close()
    us = np.array(seconds) * 1e6
    return {"artifact": path.name, "cycles": cycles, "requests": requests, "bit_identical": identical,
            "reruns": task.reruns, "launches": task.launches,
            "preempt_p50_us": float(np.percentile(us, 50)), "preempt_p99_us": float(np.percentile(us, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("artifact_dir", type=Path)
    parser.add_argument("--models", nargs="+", default=["mlp", "resnet18-small", "bert-tiny"])
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = [check(args.artifact_dir / f"{name}.tvms", args.cycles, args.requests) for name in args.models]
    for result in results:
        print(json.dumps(result), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
