"""fp16 against fp32, model by model: how far `tvmsched compile --precision fp16` is from onnxruntime in fp32.

For each model: compiled at fp16 (the compile's seconds), its max|Δ| against onnxruntime fp32 over a few seeded
inputs as a share of the bound 2e-2 * max(1, max|ref|) (docs/precision.md; ≤ 1 passes), the top-1 agreement on the
inputs whose fp32 top-2 margin exceeds the bound (single-row classifiers), the weight bytes against fp32, and the
layers computing in fp16. A model that does not compile at fp16 gets its one error line. One JSON line per model;
--out writes them all.

    python bench/precision.py --models mlp resnet18-small bert-tiny mobilenetv2 resnet50 --out build/precision.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402

from tvmsched import models  # noqa: E402
from tvmsched.errors import TvmschedError  # noqa: E402
from tvmsched.lower.precision import fp16_bound  # noqa: E402


def one(name: str, seeds: int, top1_inputs: int) -> dict:
    import onnxruntime

    from tvmsched.pipeline import compile_model
    from tvmsched.runtime import Executor

    if name in models.REAL_MODELS:
        model = onnx.load(models.real_model_path(name, seed=0))
        shapes = models.REAL_MODELS[name].input_shapes
        feeds = lambda seed: models.real_inputs(name, seed=seed)  # noqa: E731
    else:
        model, shapes = models.build(name), None
        feeds = lambda seed: models.random_inputs(model, seed=seed)  # noqa: E731
    row: dict = {"model": name}
    started = time.perf_counter()
    try:
        fp16 = compile_model(model, name=name, input_shapes=shapes, precision="fp16")
    except TvmschedError as err:
        return {**row, "error": str(err)}
    row["compile_s"] = round(time.perf_counter() - started, 1)
    fp32 = compile_model(model, name=name, input_shapes=shapes)
    manifest = fp16.manifest
    weights = lambda m: sum(s.nbytes for s in m.tensors.values() if s.kind == "weight")  # noqa: E731
    row["weights_fp16_over_fp32"] = round(weights(manifest) / max(1, weights(fp32.manifest)), 3)
    dtypes = [manifest.tensors[layer.outputs[0]].dtype for layer in manifest.layers]
    row["layers"] = {"float16": dtypes.count("float16"), "other": len(dtypes) - dtypes.count("float16")}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    executor = Executor(fp16)
    share = 0.0
    for seed in range(seeds):
        inputs = feeds(seed)
        got, want = executor.run(inputs), dict(zip(names, session.run(names, inputs)))
        for key, ref in want.items():
            share = max(share, float(np.abs(np.asarray(got[key], np.float64) - ref).max()) / fp16_bound(ref))
    row["max_error_over_bound"] = round(share, 4)
    first = want[names[0]]
    if top1_inputs and first.ndim == 2 and first.shape[0] == 1 and first.shape[1] > 1:  # one row of class scores
        clear = agree = 0
        for seed in range(top1_inputs):
            inputs = feeds(seed)
            ref = session.run(names[:1], inputs)[0].ravel()
            top2 = np.sort(ref)[-2:]
            if top2[1] - top2[0] <= fp16_bound(ref):
                continue
            clear += 1
            agree += int(np.argmax(np.asarray(executor.run(inputs)[names[0]]).ravel()) == np.argmax(ref))
        row["top1"] = {"inputs": top1_inputs, "clear_margin": clear, "agree": agree}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "resnet18-small", "bert-tiny", "mobilenetv2"])
    parser.add_argument("--seeds", type=int, default=3, help="inputs checked against the bound")
    parser.add_argument("--top1-inputs", type=int, default=100, help="seeded inputs for the top-1 agreement")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = {"machine": _common.machine_info(), "date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv),
              "rows": []}
    for name in args.models:
        row = one(name, args.seeds, args.top1_inputs)
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
