"""Progress-counter overhead: whole-model latency with and without in-kernel counters, side by side.

    python bench/progress_counters.py --db sqlite:///build/progress/tuning.sqlite --tune-trials 8 \
        --out bench/results/raw/progress_counters_cpu.json
CPU kernels come from the tuning database (tuned first where it has no records), so they have the
parallel loops whose iterations are counted; both artifacts keep the preempt checks (the default).
GPU: compile here with `--device cuda --compile-only` (default schedules), carry --artifact-dir to
the GPU machine and run `python3 bench/progress_counters.py --device cuda --no-compile --out ...`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from preemption import interleaved_p50  # noqa: E402

MODELS = ["mlp", "resnet18-small", "bert-tiny"]


def compile_pair(name: str, paths: dict[str, Path], target: str, tuning: dict) -> None:
    """The model with ("counted") and without ("plain") progress counters (needs the full TVM)."""
    from tvmsched import models
    from tvmsched.pipeline import compile_model

    for label, path in paths.items():
        compile_model(models.build(name), name=name, target=target, progress_counters=label == "counted", **tuning).save(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--db", help="tuning database URL (CPU)")
    parser.add_argument("--tune-trials", type=int, default=8)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--artifact-dir", type=Path, default=Path("build/progress"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="Time the artifacts already in --artifact-dir.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    target = "cuda" if args.device == "cuda" else "llvm"
    args.artifact_dir.mkdir(parents=True, exist_ok=True)
    report = {"device": args.device, "machine": f"{platform.machine()}, {platform.node()}", "models": []}
    tuning = {"tune_trials": args.tune_trials, "database": args.db} if target == "llvm" else {}
    for name in args.models:
        paths = {"counted": args.artifact_dir / f"{name}.counted.tvms", "plain": args.artifact_dir / f"{name}.tvms"}
        if not args.no_compile:
            compile_pair(name, paths, target, tuning)
        if args.compile_only:
            continue
        p50, runs, _ = interleaved_p50(paths, args.device, args.rounds, args.repeat)
        report["models"].append({"model": name, "plain_ms_p50": p50["plain"], "counted_ms_p50": p50["counted"],
                                 "overhead": p50["counted"] / p50["plain"] - 1, "runs": runs})
        print(json.dumps(report["models"][-1]), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
