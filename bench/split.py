"""A model split across devices (issue 40, step 2): what the split costs against one device, on CPU devices.

    python bench/split.py [--models resnet18-small,bert-tiny,mobilenetv2] [--runs 200] [--out FILE]

Per model, side by side in one run, the ways in turn in rounds of 20 requests:
- **one device**: `Executor.run` on the whole machine's CPU device (2 threads here);
- **split**: `SplitExecutor` over `cpu:0,cpu:1`, each a share of the cores (1 thread each here), a request running
  device 0's group and then device 1's, the crossing activations copied through the host between them.
Reported: p50 and p99 per way, their ratio, the bytes crossing per request, each device's memory against the
model's weights, and whether every output was the same bits.

Then, per model, throughput with 4 requests outstanding (bench/serving.py's closed loop: 4 client threads, 2 s per way,
the ways in turn, 3 rounds; every answer checked against one device's bits):
- **one device**: a `Runtime` on the whole machine's CPU device;
- **split, in turn**: `SplitExecutor`, one request at a time (its parts one after the other);
- **split in the Runtime**: `Runtime(devices=("cpu:0", "cpu:1")).load(split=True)`: each part a model on its
  device's Runtime, so the devices work on different requests at once.

Last, mechanism D from a memory plan (resnet18-small, budget between its two parts): the part that streams, its
milliseconds per request and its copy floor (its streamed weights copied from its device's tier share into a
stream buffer, the fastest of 5: `native.tier_copy_floor`, as bench/tiering.py measures one device's).
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
        row["throughput"] = throughput(path, inputs, want)
        report["models"][name] = row
        print(name, json.dumps(row), flush=True)
    report["plan"] = streamed_part(args.work / "resnet18-small.tvms", args.runs)
    print("plan", json.dumps(report["plan"]), flush=True)
    report["load_average_end"] = os.getloadavg()
    if args.out:
        _common.write_json_atomic(args.out, report)


def throughput(path: Path, inputs: dict, want: dict, seconds: float = 2.0) -> dict:
    """Requests per second of each way with 4 client threads (the median of 3 rounds, the ways in turn)."""
    from serving import closed_loop  # bench/serving.py

    from tvmsched.runtime import Runtime, SplitExecutor

    wrong = []

    def checked(run):
        def call():
            got = run(inputs)
            if not all(np.array_equal(v, want[k]) for k, v in got.items()):
                wrong.append(got)
        return call

    with Runtime("cpu") as one, Runtime(devices=("cpu:0", "cpu:1")) as two:
        whole, split = one.load(str(path)), two.load(str(path), split=True)
        in_turn = SplitExecutor(path, ("cpu:0", "cpu:1"))  # (one request at a time: a lock around its parts)
        ways = {"one device": checked(lambda x: one.submit(whole, x).result(timeout=120)),
                "split, in turn": checked(in_turn.run),
                "split in the Runtime": checked(lambda x: two.submit(split, x).result(timeout=120))}
        rates = {way: [] for way in ways}
        for _ in range(3):
            for way, call in ways.items():
                rates[way].append(len(closed_loop(lambda c=call: c, 4, seconds)) / seconds)
    assert not wrong, f"{len(wrong)} answers differ from one device's"
    return {way: float(np.median(r)) for way, r in rates.items()}


def streamed_part(path: Path, count: int) -> dict:
    """resnet18-small from a memory plan on cpu:0,cpu:1 under a budget between its parts: the streamed part's time per
    request and its copy floor."""
    from dataclasses import replace

    from tvmsched.runtime import Executor, Runtime, SplitExecutor, native
    from tvmsched.runtime.tiering import Gpu, Tier, TierSettings, TierTask, Topology, plan_memory

    first, second = (m["in_use"] for m in SplitExecutor(path, ("cpu:0", "cpu:1")).memory())
    budget = (first + second) // 2
    task = replace(TierTask.from_artifact(path, 2), name="resnet18-small")
    plan = plan_memory(Topology((Gpu(0, budget), Gpu(1, budget)), (Tier("dram", 64 << 20),)), [task])
    alone = Executor(str(path))
    inputs = alone.random_inputs(0)
    want = alone.run(inputs)
    with Runtime(devices=("cpu:0", "cpu:1"), memory_budget=budget,
                 tiering=TierSettings(topology=plan.topology, plan=plan)) as rt:
        model = rt.load(str(path), plan=plan, name="resnet18-small")
        parts = rt._engine.engine_models(model.name)
        for _ in range(5):
            rt.submit(model, inputs).result(timeout=60)
        times = []
        for _ in range(count):
            start = time.perf_counter()
            got = rt.submit(model, inputs).result(timeout=60)
            times.append((time.perf_counter() - start) * 1e3)
            assert all(np.array_equal(v, want[k]) for k, v in got.items())
        placements = [Executor.over(p, str(path)).placement for p in parts]
        streamed = placements.index("streamed")
        floor = {str(k): {"seconds": float(v[0]), "bytes": int(v[1])}
                 for k, v in native.tier_copy_floor(parts[streamed], 5).items()}
        info = native.tiering_info(parts[streamed])
    return {"budget_bytes": budget, "placements": placements, "plan_use_bytes": plan.gpu(streamed).uses["dram"],
            "p50_ms": float(np.percentile(times, 50)), "p99_ms": float(np.percentile(times, 99)),
            "copy_floor": floor, "tiers": [{k: (int(v) if k == "used_bytes" else str(v)) for k, v in t.items()}
                                           for t in info["tiers"]]}


if __name__ == "__main__":
    main()
