"""Compile seconds of an earlier tvmsched (a source tree, e.g. `git archive f74d956`) against this one, side by side.

    mkdir /tmp/old && git archive f74d956 | tar -x -C /tmp/old && cp -r tvmsched/lib /tmp/old/tvmsched/
    python bench/compile_then_now.py --then /tmp/old --label f74d956 [--models tiny,mlp,...]

Each compile runs in a fresh process (`compile_file` alone, after an untimed warm-up compile), the earlier tree
first on PYTHONPATH, alternating then/now per model, best of --repeat. Writes the raw JSON that bench/speed.py
reads as --baseline-json (default bench/results/raw/compile_baseline.json). A model the earlier tree cannot
compile (it imported fewer real exports) is recorded with its error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _common import ChildFailed, run_child  # noqa: E402

CHILD = r"""
import json, sys, time
from tvmsched import models
from tvmsched.pipeline import compile_file, compile_model
path, shapes = sys.argv[1], json.loads(sys.argv[2])
compile_model(models.build("tiny"), name="warmup")
start = time.perf_counter()
compile_file(path, input_shapes={k: tuple(v) for k, v in shapes.items()} or None)
print(json.dumps({"compile_s": time.perf_counter() - start}))
"""


def model_file(name: str, work: Path) -> tuple[Path, dict]:
    from tvmsched import models

    if name in models.MODELS:
        path = work / f"{name}.onnx"
        if not path.exists():
            models.save(name, path, seed=0)
        return path, {}
    return models.real_model_path(name, 0), {k: list(v) for k, v in models.REAL_MODELS[name].input_shapes.items()}


def timed(tree: Path | None, path: Path, shapes: dict) -> dict:
    env = dict(os.environ, TVM_NUM_THREADS=os.environ.get("TVM_NUM_THREADS", str(os.cpu_count() or 1)))
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{env.get('PYTHONPATH', '')}"
    try:  # from "/": the current folder comes first on sys.path and would shadow the earlier tree
        return run_child([CHILD, str(path), json.dumps(shapes)], env, cwd="/")
    except ChildFailed as err:
        return {"error": str(err)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--then", type=Path, required=True, help="source tree of the earlier tvmsched")
    parser.add_argument("--label", default="earlier", help="what the earlier tree is (a git revision)")
    parser.add_argument("--models", default="tiny,mlp,resnet18,resnet18-small,mobilenetv2,bert-tiny,"
                        "resnet50,densenet121,inception-v1,vgg19,squeezenet,shufflenet,alexnet")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "compile_then_now")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "raw" / "compile_baseline.json")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    then, now, errors = {}, {}, {}
    for name in [m for m in args.models.split(",") if m]:
        path, shapes = model_file(name, args.work)
        runs = {"then": [], "now": []}
        for _ in range(args.repeat):
            for which, tree in (("then", args.then), ("now", None)):
                runs[which].append(timed(tree, path, shapes))
        for which, store in (("then", then), ("now", now)):
            ok = [r["compile_s"] for r in runs[which] if "compile_s" in r]
            if ok:
                store[name] = round(min(ok), 2)
            else:
                errors[f"{which}:{name}"] = runs[which][0]["error"]
        print(f"{name}: then {then.get(name, 'failed')} s, now {now.get(name, 'failed')} s", flush=True)
    args.out.write_text(json.dumps({
        "source": f"bench/compile_then_now.py: {args.label} measured side by side with this tree, same machine, same run",
        "compile_s": then, "compile_s_now": now, "errors": errors}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
