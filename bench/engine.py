"""Serving-path cost benchmark: per-request overhead of Runtime.submit vs a direct Executor.run, preempt() latency
and a real-time + best-effort mix. Uses only the public API, so the same script measures any runtime engine.

    python bench/engine.py --out bench/results/raw/engine_cpu_before.json [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).parent))
import preemption as preemption_bench  # noqa: E402  (bench/ is not a package)

PREEMPT_MODELS = ("resnet18-small", "bert-tiny")


def chain_model(layers: int = 64, size: int = 32, seed: int = 0, relu: bool = False) -> onnx.ModelProto:
    """x: [1, size] through `layers` MatMuls with seeded [size, size] weights scaled by 1/sqrt(size)."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        out = "y" if i == layers - 1 and not relu else f"h{i}"
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [out], name=f"matmul{i}"))
        x = out
        if relu:
            out = "y" if i == layers - 1 else f"r{i}"
            nodes.append(helper.make_node("Relu", [x], [out], name=f"relu{i}"))
            x = out
    graph = helper.make_graph(nodes, f"chain{layers}x{size}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tvmsched-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def compile_chain(out_dir: Path, layers: int, size: int, recompile: bool = False) -> Path:
    """The chain artifact in `out_dir` (compiled unless already there)."""
    from tvmsched.pipeline import compile_model

    path = out_dir / f"chain-{layers}x{size}.tvms"
    if recompile or not path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        compile_model(chain_model(layers, size), name=path.stem, target="llvm").save(path)
    return path


def _stats(seconds: list[float]) -> dict:
    us = np.array(seconds) * 1e6
    return {"p50_us": float(np.percentile(us, 50)), "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()), "n": len(us)}


def per_request_cost(artifact_path: Path, requests: int = 2000, warmup: int = 200, rounds: int = 10, seed: int = 0) -> dict:
    """Wall time per request: ex.run() direct vs rt.submit().result() one at a time, interleaved in rounds."""
    from tvmsched.runtime import Runtime, load

    ex = load(artifact_path)
    inputs = ex.random_inputs(seed)
    per_round = max(1, requests // rounds)
    times: dict[str, list[float]] = {"direct": [], "submit": []}
    with Runtime("cpu") as rt:
        model = rt.load(artifact_path, priority="best_effort", name="chain")
        ways = {"direct": lambda: ex.run(inputs), "submit": lambda: rt.submit(model, inputs).result()}
        expected = ex.run(inputs)
        got = rt.submit(model, inputs).result()
        same = all(np.array_equal(expected[k], got[k]) for k in expected)
        for call in ways.values():
            for _ in range(warmup):
                call()
        for r in range(rounds):
            order = list(ways) if r % 2 == 0 else list(reversed(ways))  # alternate which goes first
            for label in order:
                call, out = ways[label], times[label]
                for _ in range(per_round):
                    start = time.perf_counter()
                    call()
                    out.append(time.perf_counter() - start)
        scheduler = rt.stats().get("_scheduler")  # the layer scheduler's decision time per submit (warmup included)
    n_layers = ex.num_layers
    direct, submit = _stats(times["direct"]), _stats(times["submit"])
    return {"artifact": str(artifact_path), "layers": n_layers, "rounds": rounds, "warmup": warmup,
            "outputs_identical": same, "scheduler": scheduler, "direct": direct, "submit": submit,
            "submit_over_direct_p50": submit["p50_us"] / direct["p50_us"],
            "submit_p50_us_per_layer": submit["p50_us"] / n_layers,
            "direct_p50_us_per_layer": direct["p50_us"] / n_layers,
            "overhead_p50_us_per_layer": (submit["p50_us"] - direct["p50_us"]) / n_layers}


def ensure_zoo(out_dir: Path, recompile: bool = False) -> None:
    """Compile resnet18-small and bert-tiny into `out_dir` with bench/preemption.py's compile_all, unless there."""
    missing = [m for m in PREEMPT_MODELS if recompile or not (out_dir / f"{m}.tvms").exists()]
    if missing:
        preemption_bench.compile_all(out_dir, missing, "llvm")


def machine() -> dict:
    import tvm

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent).stdout.strip()
        except OSError:
            return ""

    return {"processor": platform.processor() or _cpu_model(), "machine": platform.machine(), "node": platform.node(),
            "cpu_count": os.cpu_count(), "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "python": platform.python_version(), "tvm": tvm.__version__, "git_commit": git("rev-parse", "HEAD"),
            "git_dirty": git("status", "--porcelain", "--", "runtime", "tvmsched", "passes").splitlines()}


def _cpu_model() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return ""


def run_all(out_dir: Path, quick: bool = False, recompile: bool = False, seed: int = 0) -> dict:
    """Every measurement; `quick` shrinks sample counts for a smoke run."""
    started = time.perf_counter()
    report: dict = {"machine": machine(), "quick": quick, "seed": seed}
    chain = compile_chain(out_dir, 64, 32, recompile)
    ensure_zoo(out_dir, recompile)
    report["machine"]["git_dirty_at_start"] = report["machine"].pop("git_dirty")
    requests, warmup = (400, 50) if quick else (2000, 200)
    report["per_request"] = per_request_cost(chain, requests, warmup, seed=seed)
    samples = 9 if quick else 300  # every 3rd sample is a preempt()
    report["preempt"] = [preemption_bench.preemption_latency(out_dir, m, "cpu", samples, seed) for m in PREEMPT_MODELS]
    report["mix"] = preemption_bench.mix(out_dir, "resnet18-small", "bert-tiny", "cpu", 2.0 if quick else 10.0, 0.5, seed)
    report["machine"]["git_dirty_at_end"] = machine()["git_dirty"]
    report["seconds"] = time.perf_counter() - started
    return report


def table(report: dict) -> str:
    """A short human-readable summary."""
    pr, lines = report["per_request"], []
    lines.append(f"per request ({pr['layers']} layers)      p50 us    p99 us   mean us")
    for k in ("direct", "submit"):
        s = pr[k]
        lines.append(f"  {k:26s} {s['p50_us']:9.1f} {s['p99_us']:9.1f} {s['mean_us']:9.1f}")
    lines.append(f"  submit/direct p50 {pr['submit_over_direct_p50']:.2f}x; submit {pr['submit_p50_us_per_layer']:.2f} us/layer "
                 f"(overhead {pr['overhead_p50_us_per_layer']:.2f} us/layer)")
    for p in report["preempt"]:
        lines.append(f"preempt {p['model']:18s} p50 {p['preempt']['p50_us']:8.1f} us  p99 {p['preempt']['p99_us']:8.1f} us"
                     f"  (request {p['request_ms']:.1f} ms)")
    mx = report["mix"]
    for mode in ("alone", "preemption", "shared"):
        m = mx[mode]
        lines.append(f"mix {mode:11s} RT p50 {m['rt_p50_ms']:7.2f} ms p99 {m['rt_p99_ms']:7.2f} ms  BE {m['be_per_s']:5.2f}/s"
                     f"  preemptions {m['preemptions']}")
    lines.append(f"total {report['seconds']:.0f} s")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write.")
    parser.add_argument("--artifact-dir", type=Path, default=Path("out/bench-engine"), help="Artifact cache.")
    parser.add_argument("--quick", action="store_true", help="Small sample counts (smoke run).")
    parser.add_argument("--recompile", action="store_true", help="Compile the artifacts even if cached.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    report = run_all(args.artifact_dir, args.quick, args.recompile, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(table(report))


if __name__ == "__main__":
    main()
