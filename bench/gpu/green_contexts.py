"""GPU probe: run an artifact's layers on CUDA green contexts limited to k SMs (cuda-python).

Measures each layer's latency (the artifact's candidate 0) at several SM counts, checks that a whole
run inside a green context gives the same outputs, and prints JSON. Runs on the GPU machine with the
runtime-only kit:  python3 bench/gpu/green_contexts.py .gpu/resnet18.tvms --out result.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def time_layer(executor, index: int, stream: int, gc, repeat: int) -> float:
    import tvm_ffi

    with tvm_ffi.use_raw_stream(executor.device, stream):
        for _ in range(3):
            executor.run_layer(index)
        gc.synchronize(stream)
        start = time.perf_counter()
        for _ in range(repeat):
            executor.run_layer(index)
        gc.synchronize(stream)
    return (time.perf_counter() - start) / repeat * 1e6


def main() -> None:
    import tvm_ffi

    from tvmsched.runtime import Executor
    from tvmsched.runtime.green_contexts import GreenContexts

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--sms", default="8,16,32,66,132")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    executor = Executor(args.artifact, "cuda")
    inputs = executor.random_inputs(seed=1)
    reference = executor.run(inputs)
    gc = GreenContexts()
    result = {"artifact": args.artifact.name, "sm_count": gc.sm_count, "granularity": gc.granularity, "curves": {}, "checks": {}}
    print(json.dumps({"sm_count": gc.sm_count, "granularity": gc.granularity}), flush=True)
    streams = {}
    for k in [int(x) for x in args.sms.split(",")]:
        stream, granted = gc.stream(k)
        streams[granted] = stream
        with tvm_ffi.use_raw_stream(executor.device, stream):
            executor.set_inputs(inputs)
            executor.run_layers()
            gc.synchronize(stream)
            outputs = executor.get_outputs()
        result["checks"][granted] = max(float(np.max(np.abs(outputs[n] - reference[n]))) for n in reference)
        print(json.dumps({"sms": granted, "max_abs_diff_vs_default_stream": result["checks"][granted]}), flush=True)
    for index, layer in enumerate(executor.manifest.layers):
        curve = {granted: time_layer(executor, index, stream, gc, args.repeat) for granted, stream in sorted(streams.items())}
        blocks = layer.candidates[0].blocks
        result["curves"][f"{index}:{layer.func}"] = {"blocks": blocks, "latency_us": curve}
        print(json.dumps({"layer": index, "func": layer.func, "us": {k: round(v, 1) for k, v in curve.items()}}), flush=True)
    result["executor"] = executor_check(args.artifact, inputs, reference)
    print(json.dumps(result["executor"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))


def executor_check(path: Path, inputs: dict, reference: dict, sms: int = 16) -> dict:
    """The executor with an extra candidate per layer limited to `sms` SMs (same kernel): outputs and latency."""
    import dataclasses

    from tvmsched.artifact import Artifact
    from tvmsched.runtime import Executor

    artifact = Artifact.load(path)
    layers = tuple(
        dataclasses.replace(layer, candidates=(layer.candidates[0], dataclasses.replace(layer.candidates[0], id=1, units=sms)))
        for layer in artifact.manifest.layers
    )
    executor = Executor(Artifact(dataclasses.replace(artifact.manifest, layers=layers), artifact.library, artifact.weights), "cuda")
    report = {"sms": sms}
    for label, ids in {"all_full": [0] * len(layers), "all_limited": [1] * len(layers), "alternating": [i % 2 for i in range(len(layers))]}.items():
        outputs = executor.run(inputs, ids)
        start, runs = time.perf_counter(), 20
        for _ in range(runs):
            executor.run(inputs, ids)
        report[label] = {
            "max_abs_diff": max(float(np.max(np.abs(outputs[n] - reference[n]))) for n in reference),
            "ms_per_run_incl_copies": (time.perf_counter() - start) / runs * 1e3,
        }
    return report


if __name__ == "__main__":
    main()
