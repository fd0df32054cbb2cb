"""Which CUDA path each model's FLOPs take, at fp32 and at fp16, as `tvmsched compile --target cuda` schedules them
(issue 41): tensor cores, split-K, SIMT for matmul-like layers; a warp or a block per row for row reductions; the
rest (element-wise, pooling, GEMV) as "other". Compile-time only (lowering and default schedules, no kernel build),
so it runs without a GPU; the speed of each path is docs/gpu.md's plan, step 3.

    python bench/gpu_paths.py --models bert-tiny mobilenetv2 resnet18 resnet50 bert-base --out build/gpu_paths.json

One JSON line per model and precision: the share of the FLOPs on each path, the layers on each, and the
tensor-core layers' blocks (a 128 x 128 tile each: below one wave of the target's SMs where fewer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from tvmsched import models  # noqa: E402


def paths(name: str, precision: str) -> dict:
    from tvmsched.lower import gpu_schedule, kernels
    from tvmsched.lower.targets import gpu_sms
    from tvmsched.passes.launch_geometry import launch_blocks
    from tvmsched.pipeline import lower_model

    if name in models.REAL_MODELS:
        model, shapes = onnx.load(models.real_model_path(name, seed=0)), models.REAL_MODELS[name].input_shapes
    else:
        model, shapes = models.build(name), None
    started = time.perf_counter()
    graph, funcs, target = lower_model(model, "cuda", shapes, precision=precision)
    scheduled = kernels.default_schedule(funcs, target)
    uses: dict[str, int] = {}
    for layer in graph.layers:
        uses[layer.func] = uses.get(layer.func, 0) + 1
    flops: dict[str, float] = {}
    layers: dict[str, int] = {}
    tensor_blocks = []
    for f, func in scheduled.items():
        path = kernels.gpu_path(funcs[f], func)[0] or "other"
        flops[path] = flops.get(path, 0.0) + kernels.estimated_flops(funcs[f]) * uses[f]
        layers[path] = layers.get(path, 0) + uses[f]
        if path == gpu_schedule.TENSOR_CORES:
            import tvm

            tensor_blocks += [min(launch_blocks(tvm.IRModule({"main": func})))] * uses[f]
    total = sum(flops.values()) or 1.0
    sms = gpu_sms(target)
    return {
        "model": name, "precision": precision, "gflop": round(total / 1e9, 3),
        "share": {p: round(v / total, 4) for p, v in sorted(flops.items(), key=lambda kv: -kv[1])}, "layers": layers,
        "tensor_core_layers_below_a_wave": sum(b < sms for b in tensor_blocks), "sms": sms,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["bert-tiny", "mobilenetv2", "resnet18-small", "resnet18"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        for precision in args.precisions:
            rows.append(paths(name, precision))
            print(json.dumps(rows[-1]), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": _common.machine_info(), "command": " ".join(sys.argv), "rows": rows},
                                       indent=1))


if __name__ == "__main__":
    main()
