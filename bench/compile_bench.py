"""Compile benchmark: per zoo model, compile time, artifact size, and run latency and peak memory of
the tvmsched executor vs onnxruntime with the same thread count, side by side in one run.

    python bench/compile_bench.py [--models ...] [--repeat 50] [--threads N] [--out bench/results/compile.md]

Each engine runs in a fresh child process so its peak RSS is its own.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import measure_engine  # noqa: E402  (bench/ is not a package; the engine children live there)


def bench_model(name: str, folder: Path, repeat: int, threads: int) -> dict:
    from tvmsched import models
    from tvmsched.pipeline import compile_file

    onnx_path, artifact_path = folder / f"{name}.onnx", folder / f"{name}.tvms"
    models.save(name, onnx_path)
    start = time.perf_counter()
    artifact = compile_file(onnx_path)
    compile_s = time.perf_counter() - start
    artifact.save(artifact_path)
    return {
        "model": name,
        "layers": len(artifact.manifest.layers),
        "compile_s": compile_s,
        "artifact_mb": artifact_path.stat().st_size / 1e6,
        "onnx_mb": onnx_path.stat().st_size / 1e6,
        "tvmsched": measure_engine("tvmsched", artifact_path, repeat, threads),
        "onnxruntime": measure_engine("onnxruntime", onnx_path, repeat, threads),
    }


def write_markdown(rows: list[dict], args, out: Path) -> None:
    import onnxruntime
    import tvm

    lines = [
        "# Compile and run benchmark (default schedules, no tuning)",
        "",
        f"Command: `python bench/compile_bench.py --repeat {args.repeat} --threads {args.threads}`  ",
        f"Machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} cores, {platform.platform()}; "
        f"python {platform.python_version()}, tvm {tvm.__version__}, onnxruntime {onnxruntime.__version__}; "
        f"date {time.strftime('%Y-%m-%d')}; threads {args.threads} for both engines; inputs seeded (seed 0).",
        "",
        "Latency: whole-model run, inputs already in place, p50/p99 over the repeats. Peak memory: peak RSS of a fresh",
        "process running only that engine; 'model' is the peak minus the RSS after importing the engine.",
        "",
        "| model | layers | compile s | artifact MB | onnx MB | tvmsched p50 ms | ort p50 ms | tvmsched/ort p50 | tvmsched p99 ms | ort p99 ms | tvmsched peak MB (model) | ort peak MB (model) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t, o = r["tvmsched"], r["onnxruntime"]
        lines.append(
            f"| {r['model']} | {r['layers']} | {r['compile_s']:.1f} | {r['artifact_mb']:.2f} | {r['onnx_mb']:.2f} | "
            f"{t['p50_ms']:.3f} | {o['p50_ms']:.3f} | {t['p50_ms'] / o['p50_ms']:.2f}x | {t['p99_ms']:.3f} | {o['p99_ms']:.3f} | "
            f"{t['peak_rss_mb']:.0f} ({t['model_rss_mb']:.0f}) | {o['peak_rss_mb']:.0f} ({o['model_rss_mb']:.0f}) |"
        )
    lines += [
        "", "Reading: kernels use TVM's default schedules here (no tuning): on CPU the legalized TIR loops run",
        "unscheduled and mostly single-threaded, so the executor is an order of magnitude slower than onnxruntime;",
        "tuning (bench/results/tuning.md) closes most of that gap. Artifacts are about the size of the ONNX weights.",
    ]
    lines += gpu_section(out.parent / "raw" / "gpu_check_h100.json")
    out.write_text("\n".join(lines) + "\n")


def gpu_section(raw: Path) -> list[str]:
    """The H100 check (bench/gpu/check.py, run on the lent GPU machine), if recorded."""
    if not raw.exists():
        return ["", "## GPU", "", "No GPU result recorded (no GPU machine was lent)."]
    data = json.loads(raw.read_text())
    lines = [
        "", "## GPU: H100, CUDA artifacts compiled here (dlight default schedules, fatbin via nvcc)", "",
        "Commands: here `tvmsched compile M.onnx --target cuda -o .gpu/M.tvms` and `bash bench/gpu/make-kit.sh`;",
        "on the GPU machine `source .devkit/activate.sh && python3 bench/gpu/check.py .gpu --out gpu_check.json`",
        f"(raw: `bench/results/raw/{raw.name}`). Device: {data['gpu']}. Reference: onnxruntime on the GPU machine's CPU.",
        "", "| model | layers | device code | max abs err vs ort | allclose 1e-4 | p50 ms | p99 ms | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in data["models"]:
        lines.append(
            f"| {m['model']} | {m['layers']} | {m['device_code']} | {m['max_abs_error_vs_onnxruntime']:.2g} | "
            f"{m['allclose_rtol_atol_1e-4']} | {m['latency_ms_p50']:.3f} | {m['latency_ms_p99']:.3f} | {m['runs']} |"
        )
    return lines


def main() -> None:
    from tvmsched import models

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=[spec.name for spec in models.list_models()])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "compile.md")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tvmsched-bench-") as tmp:
        for name in args.models:
            rows.append(bench_model(name, Path(tmp), args.repeat, args.threads))
            print(json.dumps(rows[-1]), flush=True)
    write_markdown(rows, args, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
