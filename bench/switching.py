"""Pipelined switching (issue 13): switch overheads side by side in one process, for the zoo and a
generated ResNet-50-size model (ResNet-18 topology widened to 25.6 M parameters, 112x112 input).

    python bench/switching.py --out bench/results/raw/switching_cpu.json [--repeat 5]

Writes the raw JSON and prints the Markdown table (bench/results/switching.md). The same measurement
runs on any artifacts with `tvmsched bench switch A.tvms B.tvms ...`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ZOO = ("mlp", "resnet18-small", "mobilenetv2", "bert-tiny")


def resnet50_size():
    """ResNet-18 topology with widths 96-768: 25.6 M parameters, like ResNet-50's."""
    from models.resnet import build_resnet18

    return build_resnet18(seed=0, image_size=112, widths=(96, 192, 384, 768), num_classes=1000, name="resnet50-size")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--work", default="/tmp/tvmsched-bench-switching")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import numpy as np

    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.cli.bench_switch import format_switching, measure_switching

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target = "cuda" if args.device == "cuda" else "llvm"
    paths = []
    for name in (*ZOO, "resnet50-size"):
        path = work / f"{name}-{target}.tvms"
        if not path.exists():
            onnx_model = resnet50_size() if name == "resnet50-size" else models.build(name)
            if name == "resnet50-size":
                params = sum(int(np.prod(t.dims)) for t in onnx_model.graph.initializer)
                print(f"resnet50-size: {params / 1e6:.1f} M parameters", file=sys.stderr)
            compile_model(onnx_model, name=name, target=target).save(path)
        paths.append(str(path))
    result = measure_switching(paths, args.device, args.repeat, progress=lambda t: print(t, file=sys.stderr))
    result.update(date=datetime.date.today().isoformat(), machine=platform.node(), python=platform.python_version(),
                  command="python " + " ".join(sys.argv))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(format_switching(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
