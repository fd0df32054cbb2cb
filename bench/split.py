"""A model split across devices (issue 40, step 2): what the split costs against one device, on CPU devices.

    python bench/split.py [--models resnet18-small,bert-tiny,mobilenetv2] [--runs 200] [--out FILE]

Per model, side by side in one run, the ways in turn in rounds of 20 requests:
- **one device**: `Executor.run` on the whole machine's CPU device (2 threads here);
- **split**: `SplitExecutor` over `cpu:0,cpu:1`, each a share of the cores (1 thread each here), a request running
  device 0's group and then device 1's, the crossing activations copied through the host between them.
Reported: p50 and p99 per way, their ratio, the bytes crossing per request, each device's memory against the
model's weights, and whether every output was the same bits.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet18-small,bert-tiny,mobilenetv2")
    parser.add_argument("--runs", type=int, default=200, help="per way")
    parser.add_argument("--work", type=Path, default=Path("build/bench-split"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.runtime import Executor, SplitExecutor

    args.work.mkdir(parents=True, exist_ok=True)
    report = {"machine": _common.machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
              "load_average": os.getloadavg(), "models": {}}
    for name in args.models.split(","):
        path = args.work / f"{name}.tvms"
        if not path.exists():
            compile_model(models.build(name), name=name).save(path)
        alone, split = Executor(str(path)), SplitExecutor(path, ("cpu:0", "cpu:1"))
        inputs = alone.random_inputs(0)
        want = alone.run(inputs)
        same = all(np.array_equal(v, want[k]) for k, v in split.run(inputs).items())
        times = {"one device": [], "split": []}
        for _ in range(5):
            alone.run(inputs)
            split.run(inputs)
        for _ in range(max(1, args.runs // 20)):
            for way, run in (("one device", alone.run), ("split", split.run)):
                for _ in range(20):
                    start = time.perf_counter()
                    run(inputs)
                    times[way].append((time.perf_counter() - start) * 1e3)
        row = {way: {"p50_ms": float(np.percentile(t, 50)), "p99_ms": float(np.percentile(t, 99))}
               for way, t in times.items()}
        memory = split.memory()
        row.update(ratio_p50=row["split"]["p50_ms"] / row["one device"]["p50_ms"], same_bits=same,
                   layers=split.layers, crossing_bytes=split.crossing_bytes, devices_memory=memory,
                   weight_bytes=sum(m["weight_bytes"] for m in memory))
        report["models"][name] = row
        print(name, json.dumps(row), flush=True)
    report["load_average_end"] = os.getloadavg()
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
