"""GPU check of progress counters: after a run, every layer's counter equals its kernels' thread blocks.

    python3 bench/gpu/progress_check.py A.tvms B.tvms --models mlp resnet18-small --out RESULT.json
(artifacts compiled with `tvmsched compile --target cuda --progress-counters`)
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
    parser.add_argument("artifacts", type=Path, nargs="+")
    parser.add_argument("--models", nargs="+", required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = []
    for path, name in zip(args.artifacts, args.models):
        executor = Executor(path, "cuda")
        model = models.build(name)
        inputs = models.random_inputs(model, seed=2)
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        reference = session.run(None, inputs)
        rng = random.Random(0)
        for trial in range(3):
            ids = [0 if trial == 0 else rng.randrange(len(l.candidates)) for l in executor.manifest.layers]
            executor.reset_progress()
            outputs = executor.run(inputs, ids)
            counted = executor.completed_blocks(ids)
            expected = [layer.candidates[c].progress_blocks for layer, c in zip(executor.manifest.layers, ids)]
            results.append({"artifact": path.name, "ids": ids, "counted": counted, "blocks": expected,
                            "equal": counted == expected,
                            "allclose_vs_onnxruntime": all(np.allclose(o, r, rtol=1e-4, atol=1e-4) for o, r in zip(outputs.values(), reference))})
            print(json.dumps({k: results[-1][k] for k in ("artifact", "equal", "allclose_vs_onnxruntime")}), flush=True)
    print("all equal:", all(r["equal"] for r in results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
