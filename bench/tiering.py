"""Memory tiering (issue 14): a model at 1x, 2x and 4x the device budget, side by side in one process.

    python bench/tiering.py --out bench/results/raw/tiering_cpu.json [--requests 20]

Per model and budget: time per request (back-to-back requests, so the streamer loads the next request's
first group while the last one runs) against running resident and against the copy floor: the bytes that
cross into the device per request (the streamer's record) at each tier's copy bandwidth measured in the same
run through the same path (host tiers: a copy from the bound memory; disk: a read of the weight file, with
O_DIRECT where the file system allows). Tier mixes: all in DRAM, and a third each in DRAM, CXL (NUMA-bound;
this machine's one node) and disk. Prints the Markdown table of bench/results/tiering.md.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODELS = ("dlrm-small", "resnet18")
FACTORS = (1, 2, 4)


def time_requests(rt, model, inputs, requests: int) -> float:
    """Seconds per request: `requests` submitted back to back, after two warm-up requests."""
    for _ in range(2):
        rt.submit(model, inputs).result(timeout=600)
    start = time.perf_counter()
    futures = [rt.submit(model, inputs) for _ in range(requests)]
    for f in futures:
        f.result(timeout=600)
    return (time.perf_counter() - start) / requests


def topology(need: int, mix: str, disk: str) -> dict:
    big = 1 << 40
    if mix == "dram":
        tiers = [{"kind": "dram", "capacity_bytes": big}]
    else:  # a third of the weights in each
        tiers = [{"kind": "dram", "capacity_bytes": need // 3}, {"kind": "cxl", "capacity_bytes": need // 3, "numa_node": 0},
                 {"kind": "disk", "capacity_bytes": big, "path": disk}]
    return {"gpus": [{"id": 0, "memory_bytes": 1}], "tiers": tiers}


def measure(path: str, name: str, device: str, requests: int, repeat: int, progress) -> list[dict]:
    from tvmsched.errors import TvmschedError
    from tvmsched.runtime import native
    from tvmsched.runtime import Runtime
    from tvmsched.runtime.executor import Executor
    from tvmsched.runtime.switching import footprint_of
    from tvmsched.runtime.tiering import TierSettings

    inputs = Executor(path).random_inputs(0)
    need = footprint_of(path, 8, device)
    gc.collect()
    rows = []
    resident_s = None
    disk = tempfile.mkdtemp(prefix="tvmsched-tier-")
    for factor in FACTORS:
        for mix in ("dram",) if factor == 1 else ("dram", "dram+cxl+disk"):
            gc.collect()
            baseline = native.device_memory(device)["in_use"]
            budget = baseline + (need + 4096 if factor == 1 else need // factor)
            with Runtime(device, memory_budget=budget, tiering=TierSettings(topology=topology(need, mix, disk))) as rt:
                try:
                    model = rt.load(path)
                except TvmschedError as err:  # e.g. two (or one) buffers of its largest layer do not fit
                    rows.append({"model": name, "factor": factor, "mix": mix, "need_bytes": need, "error": str(err)})
                    progress(f"{name} {factor}x {mix}: {err}")
                    continue
                if resident_s and resident_s > 0.1:  # slow untuned kernels: fewer requests
                    requests = min(requests, 5)
                per_request = statistics.median(time_requests(rt, model, inputs, requests) for _ in range(repeat))
                row = {"model": name, "factor": factor, "mix": mix, "need_bytes": need, "budget_bytes": budget - baseline,
                       "ms_per_request": per_request * 1e3, "peak_bytes": rt.memory()["peak"] - baseline}
                if factor == 1:
                    resident_s = per_request
                else:
                    info = rt.tiering(model)
                    events = rt.tier_events()
                    floor = native.tier_copy_floor(model.task.executor.native, 5)
                    tiers = {str(k): (float(v[0]), int(v[1])) for k, v in floor.items()}
                    streamed = sum(info["streamed_group_bytes"])
                    # bytes crossing per request: every streamed group once (checked against the record)
                    copied = sum(e.bytes for e in events) / max(1, len(events)) * len(info["streamed_group_bytes"])
                    floor_s = sum(seconds for seconds, _ in tiers.values())
                    row.update(resident_weight_bytes=info["resident_weight_bytes"], buffer_bytes=info["buffer_bytes"], buffers=info["buffers"],
                               groups=len(info["streamed_group_bytes"]), streamed_bytes=streamed, copied_per_request=copied,
                               tiers={k: {"bytes": b, "seconds": s, "gb_per_s": b / s / 1e9 if s else None} for k, (s, b) in tiers.items()},
                               copy_floor_ms=floor_s * 1e3, direct_io=info["direct_io"],
                               events=len(events))
                row["resident_ms"] = resident_s * 1e3
                row["vs_resident"] = per_request / resident_s
                if factor > 1:
                    bound = max(floor_s, resident_s)
                    row.update(vs_copy_floor=per_request / floor_s, roofline_ms=bound * 1e3, vs_roofline=per_request / bound,
                               serial_ms=(floor_s + resident_s) * 1e3, vs_serial=per_request / (floor_s + resident_s),
                               minimum_bytes=need - (budget - baseline))
                rows.append(row)
                progress(f"{name} {factor}x {mix}: {per_request * 1e3:.2f} ms/request")
            rt = model = None
            native.set_memory_budget(device, 0)
    return rows


def format_rows(rows: list[dict]) -> str:
    head = ("| model | budget | tiers | ms/request | resident ms | × resident | copy floor ms (per tier GB/s) | "
            "× copy floor | max(floor, resident) ms | × that bound | × (floor + resident) | streamed MB/request (least possible) | groups × buffers |")
    lines = [head, "|" + "---|" * 13]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | 1/{r['factor']} | {r['mix']} | does not run: {r['error'].split(': ', 1)[-1][:90]} |" + " |" * 9)
            continue
        if r["factor"] == 1:
            lines.append(f"| {r['model']} | 1× (resident) | – | {r['ms_per_request']:.2f} | {r['resident_ms']:.2f} | 1.00 | – | – | – | – | – | 0 | – |")
            continue
        bw = ", ".join(f"{k} {v['gb_per_s']:.1f}" for k, v in sorted(r["tiers"].items()) if v["gb_per_s"])
        lines.append(f"| {r['model']} | 1/{r['factor']} | {r['mix']} | {r['ms_per_request']:.2f} | {r['resident_ms']:.2f} | "
                     f"{r['vs_resident']:.2f} | {r['copy_floor_ms']:.2f} ({bw}) | {r['vs_copy_floor']:.2f} | "
                     f"{r['roofline_ms']:.2f} | {r['vs_roofline']:.2f} | {r['vs_serial']:.2f} | "
                     f"{r['copied_per_request'] / 1e6:.1f} ({r['minimum_bytes'] / 1e6:.1f}) | {r['groups']} × {r['buffers']} |")
    return "\n".join(lines)


def main() -> int:
    try:  # the installed package (on the GPU machine, the kit's wheel: the source tree has no tvmsched/runtime)
        import tvmsched  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", default="/tmp/tvmsched-bench-tiering")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    target = "cuda" if args.device == "cuda" else "llvm"
    rows = []
    for name in args.models.split(","):
        path = work / f"{name}-{target}.tvms"
        if not path.exists():  # (on a GPU machine the kit has no compiler: bench/gpu/sharing.sh links them in)
            from tvmsched import models
            from tvmsched.pipeline import compile_model

            compile_model(models.build(name), name=name, target=target).save(path)
        rows += measure(str(path), name, args.device, args.requests, args.repeat, lambda t: print(t, file=sys.stderr))
    result = {"rows": rows, "date": datetime.date.today().isoformat(), "machine": platform.node(),
              "processor": platform.processor(), "python": platform.python_version(), "command": "python " + " ".join(sys.argv)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
