"""GPU check for compiled artifacts: numerics vs onnxruntime (CPU) and latency on the device.

Runs on the GPU machine with the runtime-only kit (bench/gpu/make-kit.sh):
    python3 bench/gpu/check.py ARTIFACT_DIR --models resnet18 bert-tiny --out RESULT.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
from pathlib import Path

import numpy as np


def check_model(name: str, artifact: Path, repeat: int) -> dict:
    import onnxruntime

    from tvmsched import models
    from tvmsched.runtime import Executor

    executor = Executor(artifact, "cuda")
    model = models.build(name)
    inputs = models.random_inputs(model, seed=1)
    outputs = executor.run(inputs)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    max_abs = max(float(np.max(np.abs(outputs[k] - v))) for k, v in reference.items())
    allclose = all(np.allclose(outputs[k], v, rtol=1e-4, atol=1e-4) for k, v in reference.items())
    times_ms = np.array(executor.time_runs(inputs, repeat, warmup=10)) * 1e3
    return {
        "model": name,
        "layers": len(executor.manifest.layers),
        "device_code": executor.manifest.device_code,
        "max_abs_error_vs_onnxruntime": max_abs,
        "allclose_rtol_atol_1e-4": allclose,
        "latency_ms_p50": float(np.percentile(times_ms, 50)),
        "latency_ms_p99": float(np.percentile(times_ms, 99)),
        "runs": repeat,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("artifact_dir", type=Path)
    parser.add_argument("--models", nargs="+", default=["resnet18", "bert-tiny"])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    results = {"gpu": gpu, "host": platform.node(), "models": []}
    for name in args.models:
        results["models"].append(check_model(name, args.artifact_dir / f"{name}.tvms", args.repeat))
        print(json.dumps(results["models"][-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
