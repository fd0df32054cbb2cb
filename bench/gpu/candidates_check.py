"""GPU check of a QoS artifact's candidates (run on the GPU machine): numerics vs onnxruntime and latency.

    python3 bench/gpu/candidates_check.py ARTIFACT --model resnet18 --out RESULT.json
Runs candidate-ID lists: all full-unit (0), each layer's most restricted candidate, and random mixes.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np


def main() -> None:
    import onnxruntime

    from tvmsched import models
    from tvmsched.runtime import Executor

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--mixes", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=100)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    executor = Executor(args.artifact, "cuda")
    model = models.build(args.model)
    inputs = models.random_inputs(model, seed=1)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    layers = executor.manifest.layers
    rng = random.Random(0)
    choices = {"full_units": [0] * len(layers), "most_restricted": [len(l.candidates) - 1 for l in layers]}
    for i in range(args.mixes):
        choices[f"mix{i}"] = [rng.randrange(len(l.candidates)) for l in layers]
    results = []
    for label, ids in choices.items():
        outputs = executor.run(inputs, ids)
        executor.set_inputs(inputs)
        times = []
        for _ in range(args.repeat):
            import time

            start = time.perf_counter()
            executor.run_layers(ids)
            executor.get_outputs()
            times.append(time.perf_counter() - start)
        max_abs = max(float(np.max(np.abs(outputs[k] - v))) for k, v in reference.items())
        results.append({"ids": label, "max_abs_error_vs_onnxruntime": max_abs,
                        "allclose_1e-4": all(np.allclose(outputs[k], v, rtol=1e-4, atol=1e-4) for k, v in reference.items()),
                        "latency_ms_p50": float(np.median(times)) * 1e3,
                        "units": [layers[i].candidates[c].units for i, c in enumerate(ids)]})
        print(json.dumps({k: v for k, v in results[-1].items() if k != "units"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
