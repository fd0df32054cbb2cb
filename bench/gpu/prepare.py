"""Prepare the GPU suite's carried folder (here, where the TVM compiler is): compile, slim, record sizes.

    python bench/gpu/prepare.py [--models resnet18 bert-tiny ...] [--db URL] [--tuned MODEL=ARTIFACT ...]
    (bench/gpu/prepare.sh builds the runtime kit first, then runs this)

For each model: `tvmsched models build` (seeded ONNX) -> `tvmsched compile --target cuda` (a real fatbin
through the libcuda stub) -> the slim form of the artifact (bench/gpu/slim.py: weights cut out, to be
regenerated from the seed on the GPU machine) in `.gpu/NAME.tvms.slim`. `--db URL` also compiles each
model with that tuning database's records (variant "tuned"); `--tuned MODEL=ARTIFACT` carries an
artifact compiled elsewhere (for instance with --qos-ms from records measured on the device) as variant
"tuned". `--rows [MODEL:]PRECISION[@BATCH] ...` adds rows at another precision or batch size (variant
"fp16", "fp16-b8", "b8"; `tvmsched compile --precision fp16 --batch-sizes 8`), for every model or the one named:
the suite runs its PyTorch twin at the same precision and batch. fp16 weights are the float32 initializers
cast, so they travel as slim as fp32 ones. `.gpu/suite.json` lists what was carried, with the sizes of
everything that travels (the kit included); the total must stay under the 64 MiB one device call may carry.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(Path(__file__).resolve().parent))

# the models the suite's goals name first (its time guard runs them first), then a ResNet-50 and a
# BERT-base whose artifacts travel without weights, then the small ones
DEFAULT_MODELS = ["resnet18", "bert-tiny", "mobilenetv2", "resnet18-small", "resnet50", "bert-base", "mlp"]
CARRY_LIMIT = 64 << 20


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def git_commit() -> tuple[str | None, bool]:
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True).stdout.strip())
        return head, dirty
    except (OSError, subprocess.CalledProcessError):
        return None, False


def input_shapes(name: str) -> dict | None:
    from tvmsched import models

    return dict(models.REAL_MODELS[name].input_shapes) if name in models.REAL_MODELS else None


def parse_row(text: str, models: list[str]) -> list[tuple[str, str, int]]:
    """`[MODEL:]PRECISION[@BATCH]` -> [(model, precision, batch)] for the model named or every model."""
    model, _, rest = text.rpartition(":")
    precision, _, batch = rest.partition("@")
    if precision not in ("fp32", "fp16") or (batch and not batch.isdigit()) or (batch and int(batch) < 1):
        raise ValueError(f"--rows takes [MODEL:]fp32|fp16[@BATCH], not {text!r}")
    size = int(batch or 1)
    if (precision, size) == ("fp32", 1):
        raise ValueError(f"--rows {text}: fp32 at batch 1 is every model's default row")
    return [(name, precision, size) for name in ([model] if model else models)]


def row_variant(precision: str, batch: int) -> str:
    """A row's variant name: "fp16", "fp16-b8", "b8"."""
    return "-".join(([precision] if precision != "fp32" else []) + ([f"b{batch}"] if batch > 1 else []))


def compile_artifact(onnx_path: Path, out: Path, target: str, shapes: dict | None, db: str | None,
                     precision: str = "fp32", batch: int = 1) -> float:
    cmd = [sys.executable, "-m", "tvmsched.cli", "compile", str(onnx_path), "--target", target, "-o", str(out)]
    for name, shape in (shapes or {}).items():
        cmd += ["--input-shape", f"{name}={','.join(map(str, shape))}"]
    if db:
        cmd += ["--db", db]
    if precision != "fp32":
        cmd += ["--precision", precision]
    if batch > 1:
        cmd += ["--batch-sizes", str(batch)]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError((done.stderr.strip().splitlines() or ["compile failed"])[-1])
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--target", default="cuda", help="cuda (default) or llvm (the CPU mode of the suite, for tests)")
    parser.add_argument("--db", help="also compile each model with this tuning database's records (variant 'tuned')")
    parser.add_argument("--tuned", action="append", default=[], metavar="MODEL=ARTIFACT",
                        help="carry an artifact compiled elsewhere as MODEL's 'tuned' variant (repeatable)")
    parser.add_argument("--variant", action="append", default=[], metavar="MODEL.VARIANT=ARTIFACT",
                        help="carry an artifact compiled elsewhere as MODEL's VARIANT (repeatable; e.g. "
                        "resnet18-small.loops=r.tvms for one compiled with --loop-checks)")
    parser.add_argument("--rows", nargs="+", default=[], metavar="[MODEL:]PRECISION[@BATCH]",
                        help="also carry each model (or MODEL) compiled at this precision and batch size, e.g. fp16, "
                        "fp16@8, resnet50:fp32@8")
    parser.add_argument("--out", type=Path, default=ROOT / ".gpu", help="the carried folder (default .gpu)")
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build" / "gpu-suite", help="full artifacts and ONNX files")
    parser.add_argument("--kit", type=Path, default=ROOT / ".devkit", help="the runtime kit whose size is recorded")
    parser.add_argument("--reuse", action="store_true", help="reuse full artifacts already in --build-dir")
    args = parser.parse_args(argv)

    from tvmsched import models
    from slim import pack

    args.out.mkdir(parents=True, exist_ok=True)
    args.build_dir.mkdir(parents=True, exist_ok=True)
    for stale in list(args.out.glob("*.slim")) + [args.out / "suite.json"]:
        stale.unlink(missing_ok=True)
    device = "cpu" if args.target.split(":")[0] == "llvm" else "cuda"
    jobs = [(name, "default", None) for name in args.models]
    if args.db:
        jobs += [(name, "tuned", None) for name in args.models]
    rows = {}  # variant -> (precision, batch)
    for text in args.rows:
        try:
            parsed = parse_row(text, args.models)
        except ValueError as err:
            parser.error(str(err))
        for name, precision, batch in parsed:
            rows[row_variant(precision, batch)] = (precision, batch)
            jobs.append((name, row_variant(precision, batch), None))
    for item in args.tuned:
        name, _, path = item.partition("=")
        if not path:
            parser.error(f"--tuned takes MODEL=ARTIFACT, not {item!r}")
        jobs.append((name, "tuned", Path(path)))
    for item in args.variant:
        stem, _, path = item.partition("=")
        name, _, variant = stem.partition(".")
        if not path or not variant:
            parser.error(f"--variant takes MODEL.VARIANT=ARTIFACT, not {item!r}")
        jobs.append((name, variant, Path(path)))
    entries, failures = [], []
    for name, variant, given in jobs:
        shapes = input_shapes(name)
        stem = name if variant == "default" else f"{name}.{variant}"
        started = time.perf_counter()
        try:
            model = models.build(name, args.seed)
            onnx_path = args.build_dir / f"{name}.onnx"
            if not onnx_path.exists() or not args.reuse:
                models.save(name, onnx_path, args.seed)
            artifact = given or args.build_dir / f"{stem}-{device}.tvms"
            compile_s = 0.0
            precision, batch = rows.get(variant, ("fp32", 1))
            if given is None and not (args.reuse and artifact.exists()):
                compile_s = compile_artifact(onnx_path, artifact, args.target, shapes, args.db if variant == "tuned" else None,
                                             precision, batch)
            slim_file = args.out / f"{stem}.tvms.slim"
            record = pack(artifact, slim_file, model, name=name, seed=args.seed, input_shapes=shapes)
        except Exception as err:  # noqa: BLE001 - one model's failure is reported, the others go on
            failures.append(f"{stem}: {str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__}")
            print(f"{stem:24s} FAILED: {failures[-1]}", flush=True)
            continue
        entries.append({
            "model": name, "variant": variant, "file": slim_file.name, "seed": args.seed, "precision": precision, "batch": batch,
            "input_shapes": {k: list(v) for k, v in (shapes or {}).items()},
            "artifact_bytes": record["artifact_bytes"], "carried_bytes": record["carried_bytes"],
            "regenerated_bytes": record["regenerated_bytes"], "sha256": record["sha256"],
            "compile_s": round(compile_s, 1), "source_artifact": str(given) if given else None,
        })
        print(f"{stem:24s} artifact {record['artifact_bytes'] / 1e6:8.2f} MB -> carried {record['carried_bytes'] / 1e6:7.3f} MB "
              f"({record['weights']} weights regenerated there; compile {compile_s:.0f} s, total {time.perf_counter() - started:.0f} s)",
              flush=True)
    commit, dirty = git_commit()
    kit_bytes = folder_bytes(args.kit)
    kit_files = {str(p.relative_to(args.kit)): p.stat().st_size for p in sorted(args.kit.rglob("*")) if p.is_file()} \
        if args.kit.is_dir() else {}
    suite = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "dirty": dirty, "target": args.target, "device": device,
        "artifacts": entries, "failures": failures,
        "kit": {"path": os.path.relpath(args.kit, ROOT) if args.kit.is_absolute() else str(args.kit),
                "bytes": kit_bytes, "files": kit_files},
    }
    (args.out / "suite.json").write_text(json.dumps(suite, indent=1))
    carried = folder_bytes(args.out)
    total = carried + kit_bytes
    print(f"\ncarried: {args.out} {carried / 2**20:.2f} MiB + kit {args.kit} {kit_bytes / 2**20:.2f} MiB = "
          f"{total / 2**20:.2f} MiB of the {CARRY_LIMIT >> 20} MiB one call may carry")
    if device == "cuda":
        print('device call: carry [".devkit", ".gpu"], command "bash bench/gpu/suite.sh" (about 7 minutes at most)')
    if total > CARRY_LIMIT:
        print("error: the carried folders are over the limit: carry fewer models", file=sys.stderr)
        return 2
    return 1 if failures and not entries else 0


if __name__ == "__main__":
    sys.exit(main())
