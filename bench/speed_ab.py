"""Two builds of the same models, side by side with onnxruntime: the artifacts of two `bench/speed.py --work` folders
(say, before and after a compiler change) loaded in one process and timed in interleaved rounds, so that both builds
and onnxruntime share the machine's noise.

    python bench/speed.py --models M1,M2 --work build/speed-a ...   # with the old compiler (git stash, a checkout)
    python bench/speed.py --models M1,M2 --work build/speed-b ...   # with the new one
    python bench/speed_ab.py build/speed-a build/speed-b --models M1,M2 [--rounds 7] [--seconds 1.5]

Per model, one JSON line: each way's median over rounds of its per-round p50 (ms), both builds' ratios to
onnxruntime, the speedup a/b and each round's a/b. Both engines use --threads threads (default: every core).
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

sys.path.insert(0, str(Path(__file__).parent))
from _common import machine_info, machine_line  # noqa: E402


def onnx_path(work: Path, name: str) -> str:
    """The ONNX file a speed.py work folder compiled: the zoo's beside the artifact, a real model's in its cache."""
    local = work / f"{name}.onnx"
    if local.exists():
        return str(local)
    from tvmsched import models

    return str(models.real_model_path(name, seed=0))


def compare(a: Path, b: Path, name: str, rounds: int, seconds: float, threads: int) -> dict:
    from tvmsched.cli.compare import onnxruntime_session
    from tvmsched.runtime import Executor

    with np.load(b / f"{name}.inputs.npz") as saved:
        inputs = {key: saved[key] for key in saved.files}
    builds = {"a": Executor(str(a / f"{name}.tvms")), "b": Executor(str(b / f"{name}.tvms"))}
    session = onnxruntime_session(onnx_path(b, name), threads)
    feeds = {i.name: inputs[i.name] for i in session.get_inputs()}

    def run(way: str) -> None:
        if way == "onnxruntime":
            session.run(None, feeds)
        else:
            builds[way].run(inputs)

    ways = ("a", "b", "onnxruntime")
    p50: dict[str, list[float]] = {way: [] for way in ways}
    for way in ways:  # warm-up
        for _ in range(3):
            run(way)
    for r in range(rounds):
        for way in ways if r % 2 == 0 else ways[::-1]:
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < seconds or len(times) < 5:
                begin = time.perf_counter()
                run(way)
                times.append(time.perf_counter() - begin)
            p50[way].append(float(np.median(times)) * 1e3)
    ms = {way: statistics.median(values) for way, values in p50.items()}
    return {"model": name, "a_ms": round(ms["a"], 3), "b_ms": round(ms["b"], 3), "onnxruntime_ms": round(ms["onnxruntime"], 3),
            "a/onnxruntime": round(ms["a"] / ms["onnxruntime"], 2), "b/onnxruntime": round(ms["b"] / ms["onnxruntime"], 2),
            "speedup_a/b": round(ms["a"] / ms["b"], 2), "round_speedups": [round(x / y, 2) for x, y in zip(p50["a"], p50["b"])]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="bench/speed.py --work folder of build a")
    parser.add_argument("b", type=Path, help="bench/speed.py --work folder of build b")
    parser.add_argument("--models", required=True, help="Comma-separated models present in both folders.")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=1.5, help="Timed seconds per way per round.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    missing = [f"{folder / name}.tvms" for name in args.models.split(",") for folder in (args.a, args.b)
               if not (folder / f"{name}.tvms").exists()]
    if missing:
        sys.exit(f"error: no artifact {missing[0]} (run bench/speed.py --work with that folder first)")
    print(machine_line(machine_info()), file=sys.stderr)
    for name in args.models.split(","):
        print(json.dumps(compare(args.a, args.b, name, args.rounds, args.seconds, args.threads)), flush=True)


if __name__ == "__main__":
    main()
