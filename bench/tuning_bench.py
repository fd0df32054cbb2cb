"""Tuning benchmark: tuned vs default-schedule vs onnxruntime latency, tuning wall time and trials
per minute, and restricted-unit candidate curves (latency vs units per layer, plotted as PNG).

    python bench/tuning_bench.py [--models resnet18-small bert-tiny] [--trials 16] [--qos-factor 2.0]

Each model is tuned into a fresh SQLite database; the candidate build reuses it, with a QoS target
of qos-factor x the tuned model's latency. Latencies are measured side by side after all compiles.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tvmsched.cli.compare import latency_summary, onnxruntime_session, time_onnxruntime

RESULTS = Path(__file__).parent / "results"


def latency_ms(executor, inputs, repeat: int) -> dict:
    return latency_summary(executor.time_runs(inputs, repeat, warmup=3))


def ort_latency_ms(model, inputs, repeat: int) -> dict:
    session = onnxruntime_session(model.SerializeToString(), os.cpu_count())
    return latency_summary(time_onnxruntime(session, inputs, repeat, warmup=3))


def bench_model(name: str, trials: int, qos_factor: float, folder: Path, repeat: int) -> dict:
    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.runtime import Executor

    model, db = models.build(name), f"sqlite:///{folder / f'{name}.db'}"
    inputs = models.random_inputs(model, seed=0)
    default = Executor(compile_model(model, name=name))
    start = time.perf_counter()
    tuned_artifact = compile_model(model, name=name, tune_trials=trials, database=db, progress=True)
    tune_s = time.perf_counter() - start
    tuned = Executor(tuned_artifact)
    layers = tuned_artifact.manifest.tuning["layers"]
    new_trials = sum(layer["trials"] for layer in layers.values())
    tuned_ms = latency_ms(tuned, inputs, repeat)["p50_ms"]
    qos_ms = qos_factor * tuned_ms
    start = time.perf_counter()
    planned = compile_model(model, name=name, tune_trials=trials, database=db, qos_ms=qos_ms, progress=True)
    candidates_s = time.perf_counter() - start
    row = {
        "model": name, "trials_per_layer": trials, "tuning_s": tune_s, "trials": new_trials,
        "trials_per_min": new_trials / tune_s * 60, "fallback_layers": sum(l["status"] == "fallback" for l in layers.values()),
        "candidates_s": candidates_s, "qos_ms": qos_ms,
        "default": latency_ms(default, inputs, repeat), "tuned": latency_ms(tuned, inputs, repeat),
        "onnxruntime": ort_latency_ms(model, inputs, repeat),
        "layers": [
            {"func": l.func, "bound_us": l.qos_bound_us, "curve_us": l.unit_latency_us,
             "candidates": [{"id": c.id, "units": c.units, "blocks": c.blocks, "latency_us": c.latency_us, "schedule": c.schedule} for c in l.candidates]}
            for l in planned.manifest.layers
        ],
    }
    row["candidates_run_ms"] = latency_ms(Executor(planned), inputs, repeat)["p50_ms"]
    return row


def plot_curves(row: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seen, fig = set(), plt.figure(figsize=(9, 5.5))
    for layer in row["layers"]:
        if layer["func"] in seen:
            continue
        seen.add(layer["func"])
        units = sorted(int(k) for k in layer["curve_us"])
        line, = plt.plot(units, [layer["curve_us"][str(k)] for k in units], marker="o", linewidth=1)
        retuned = [c for c in layer["candidates"] if c["id"] > 0]
        plt.scatter([c["units"] for c in retuned], [c["latency_us"] for c in retuned], marker="x", s=60, color=line.get_color())
    plt.yscale("log")
    plt.xlabel("compute units (CPU threads)")
    plt.ylabel("isolated latency (us, log)")
    plt.title(f"{row['model']}: full-unit best per layer vs units (lines); re-tuned candidates (x)")
    plt.xticks(sorted({int(k) for layer in row["layers"] for k in layer["curve_us"]}))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_markdown(rows: list[dict], args, out: Path) -> None:
    import tvm

    lines = [
        "# Tuning benchmark (MetaSchedule, CPU)", "",
        f"Command: `python bench/tuning_bench.py --models {' '.join(args.models)} --trials {args.trials} --qos-factor {args.qos_factor}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; python {platform.python_version()}, "
        f"tvm {tvm.__version__}; date {time.strftime('%Y-%m-%d')}; all engines use {os.cpu_count()} threads; inputs seed 0.", "",
        "## Latency: default schedules vs tuned vs onnxruntime (p50 / p99 ms, measured side by side)", "",
        "| model | trials/layer | default | tuned | onnxruntime | tuned / ort (p50) | goal <= 0.8 |", "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = r["tuned"]["p50_ms"] / r["onnxruntime"]["p50_ms"]
        lines.append(
            f"| {r['model']} | {r['trials_per_layer']} | {r['default']['p50_ms']:.3f} / {r['default']['p99_ms']:.3f} | "
            f"{r['tuned']['p50_ms']:.3f} / {r['tuned']['p99_ms']:.3f} | {r['onnxruntime']['p50_ms']:.3f} / {r['onnxruntime']['p99_ms']:.3f} | "
            f"{ratio:.2f}x | {'met' if ratio <= 0.8 else 'not met'} |"
        )
    lines += ["", "## Tuning wall time", "", "| model | tuning s | trials | trials/min | fallback layers | candidate build s (re-tuning) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['tuning_s']:.0f} | {r['trials']} | {r['trials_per_min']:.1f} | {r['fallback_layers']} | {r['candidates_s']:.0f} |" for r in rows]
    lines += [
        "", "Reading: at this budget tuning cuts latency by an order of magnitude from the default schedules but stays",
        "behind onnxruntime's hand-written kernels (MetaSchedule usually needs hundreds of trials per layer). On this",
        "2-core VM many small layers run faster on 1 thread than on 2 (thread start/join dominates kernels of a few",
        "microseconds), so several 1-unit candidates beat the full-unit one. A unit count kept in step 4 can still end",
        "without a candidate: the candidate is measured again after re-tuning and dropped when over the bound.",
    ]
    for r in rows:
        lines += [
            "", f"## Candidates: {r['model']} (QoS {r['qos_ms']:.3f} ms = {args.qos_factor} x tuned p50)", "",
            f"![latency vs units]({r['model']}-units.png)", "",
            f"Running every layer's candidate 0: {r['candidates_run_ms']:.3f} ms p50.", "",
            "| layer | bound us | full-unit best at units (us) | candidates id: units, blocks, latency us (schedule) |", "|---|---|---|---|",
        ]
        seen = set()
        for layer in r["layers"]:
            if layer["func"] in seen:
                continue
            seen.add(layer["func"])
            curve = ", ".join(f"{k}: {v:.1f}" for k, v in layer["curve_us"].items())
            cands = "; ".join(f"{c['id']}: {c['units']}u, {c['blocks']}b, {c['latency_us']:.1f} ({c['schedule']})" for c in layer["candidates"])
            lines.append(f"| {layer['func']} | {layer['bound_us']:.1f} | {curve} | {cands} |")
    lines += gpu_section(RESULTS / "raw" / "green_contexts_resnet18_h100.json")
    out.write_text("\n".join(lines) + "\n")


def gpu_section(raw: Path) -> list[str]:
    """ResNet-18 layers on H100 green contexts (bench/gpu/green_contexts.py on the lent GPU machine)."""
    if not raw.exists():
        return ["", "## GPU", "", "No GPU result recorded (no GPU machine was lent)."]
    data = json.loads(raw.read_text())
    sms = sorted(int(k) for k in next(iter(data["curves"].values()))["latency_us"])
    lines = [
        "", "## GPU: ResNet-18 (224) layers on an H100 restricted by CUDA green contexts", "",
        "Commands: here `tvmsched compile resnet18.onnx --target cuda -o .gpu/resnet18.tvms` and `bash bench/gpu/make-kit.sh`;",
        "on the GPU machine `python3 bench/gpu/green_contexts.py .gpu/resnet18.tvms --out green.json`; here",
        f"`python bench/gpu/plot_green.py` (raw: `bench/results/raw/{raw.name}`). Kernels: dlight default schedules",
        "(tuning on CUDA needs measurement on the GPU, not done); each green context's SM count comes from",
        f"`cuDevSmResourceSplitByCount`: the device has {data['sm_count']} SMs, granted in groups of {data['granularity']}",
        "(asking for 66 gives 72). Outputs inside every green context equal the default stream's bit for bit.", "",
        "![ResNet-18 layers vs SMs](resnet18-h100-sms.png)", "",
        "| layer | thread blocks | " + " | ".join(f"{k} SMs us" for k in sms) + " |", "|---|---|" + "---|" * len(sms),
    ]
    for name, layer in data["curves"].items():
        lines.append(f"| {name} | {layer['blocks']} | " + " | ".join(f"{layer['latency_us'][str(k)]:.1f}" for k in sms) + " |")
    ex = data.get("executor")
    if ex:
        lines += [
            "", f"Executor with a {ex['sms']}-SM candidate per layer (same kernel on a green-context stream), whole runs incl. copies:",
            f"all full {ex['all_full']['ms_per_run_incl_copies']:.2f} ms, all {ex['sms']} SMs {ex['all_limited']['ms_per_run_incl_copies']:.2f} ms, "
            f"alternating {ex['alternating']['ms_per_run_incl_copies']:.2f} ms; max abs difference to the plain run: "
            f"{max(ex[k]['max_abs_diff'] for k in ('all_full', 'all_limited', 'alternating'))}.",
            "", "Reading: a layer stops speeding up once the SMs outnumber its thread blocks (16-block layers flatten",
            "at 16 SMs, 28-50-block ones at 32-72): the room that restricted-SM candidates leave for co-located work.",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18-small", "bert-tiny"])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--qos-factor", type=float, default=2.0)
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--from-raw", action="store_true", help="Rewrite tuning.md from raw/tuning.json without running.")
    args = parser.parse_args()
    if args.from_raw:
        write_markdown(json.loads((RESULTS / "raw" / "tuning.json").read_text()), args, RESULTS / "tuning.md")
        return
    rows = []
    with tempfile.TemporaryDirectory(prefix="tvmsched-tunebench-") as tmp:
        for name in args.models:
            rows.append(bench_model(name, args.trials, args.qos_factor, Path(tmp), args.repeat))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "layers"}), flush=True)
            plot_curves(rows[-1], RESULTS / f"{name}-units.png")
    (RESULTS / "raw").mkdir(exist_ok=True)
    (RESULTS / "raw" / "tuning.json").write_text(json.dumps(rows, indent=1))
    write_markdown(rows, args, RESULTS / "tuning.md")
    print(f"wrote {RESULTS / 'tuning.md'}")


if __name__ == "__main__":
    main()
