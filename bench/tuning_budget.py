"""Latency against the tuning budget: each model compiled with `--tune-minutes M` for several M (every
budget into a fresh SQLite database, so no budget profits from another's records), then timed side by
side with onnxruntime on the same inputs and thread count.

    python bench/tuning_budget.py [--models resnet18-small bert-tiny|FILE.onnx ...] [--minutes 2 5 10 30]
                                  [--trials-cap N] [--repeat 50] [--out bench/results/tuning_budget.md]

Budget 0 is the untuned compile (default schedules). Writes a markdown table "budget -> tvmsched p50 vs
onnxruntime p50" per model, trials and trials/minute of each compile, and the raw rows as JSON next to it
(raw/<out name>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from tvmsched.cli.compare import latency_summary, onnxruntime_session, runtime_threads, time_onnxruntime

RESULTS = Path(__file__).parent / "results"


def load(name: str):
    """A zoo model by name, or an ONNX file."""
    import onnx

    from tvmsched import models

    if name.endswith(".onnx"):
        return Path(name).stem, onnx.load(name)
    return name, models.build(name)


def p50_ms(seconds) -> float:
    return latency_summary(seconds)["p50_ms"]


def compile_at(model, name: str, minutes: float, trials_cap: int, folder: Path) -> tuple[object, float]:
    """The artifact compiled with a `minutes` budget (0: untuned) into a fresh database, and the compile's seconds."""
    from tvmsched.pipeline import compile_model

    start = time.perf_counter()
    if minutes <= 0:
        artifact = compile_model(model, name=name)
    else:
        db = f"sqlite:///{folder / f'{name}-{minutes:g}min.db'}"
        artifact = compile_model(model, name=name, tune_minutes=minutes, tune_trials=trials_cap, database=db, progress=True)
    return artifact, time.perf_counter() - start


def bench_model(spec: str, budgets: list[float], trials_cap: int, repeat: int, folder: Path) -> list[dict]:
    from tvmsched import models
    from tvmsched.runtime import Executor

    name, model = load(spec)
    inputs = models.random_inputs(model, seed=0)
    n_threads = runtime_threads()
    compiled = [(minutes, *compile_at(model, name, minutes, trials_cap, folder)) for minutes in budgets]
    session = onnxruntime_session(model.SerializeToString(), n_threads)  # one, timed beside each budget's artifact
    rows = []
    for minutes, artifact, compile_s in compiled:  # timed after all compiles: no tuning runs beside the timing
        executor = Executor(artifact)
        row = {
            "model": name, "minutes": minutes, "compile_s": compile_s, "threads": n_threads,
            "tvmsched_p50_ms": p50_ms(executor.time_runs(inputs, repeat, warmup=3)),
            "onnxruntime_p50_ms": p50_ms(time_onnxruntime(session, inputs, repeat, warmup=3)),
        }
        tuning = artifact.manifest.tuning
        if tuning:
            workloads = [v for k, v in tuning["layers"].items() if v.get("workload", k) == k]
            row.update(
                workloads=tuning["workloads"], layers=tuning["layer_count"], trials=tuning["trials"],
                tuning_s=tuning["tuning_seconds"], stage_s=tuning["seconds"], trials_per_min=tuning["trials_per_minute"],
                deadline_hit=tuning["deadline_hit"], seeded=tuning["seeded"],
                statuses={s: sum(v["status"] == s for v in workloads) for s in ("tuned", "default-kept", "fallback", "skipped", "cached")},
                per_workload=[{k: v[k] for k in ("layers", "status", "trials", "seconds", "default_us", "tuned_us", "kernel")} | {"func": f}
                              for f, v in tuning["layers"].items() if v.get("workload", f) == f],
            )
        row["ratio"] = row["tvmsched_p50_ms"] / row["onnxruntime_p50_ms"]
        print(json.dumps({k: v for k, v in row.items() if k != "per_workload"}), flush=True)
        rows.append(row)
    return rows


def write_markdown(rows: list[dict], args, out: Path) -> None:
    import tvm

    lines = [
        "# Latency against the tuning budget (CPU, MetaSchedule with --tune-minutes)", "",
        f"Command: `python bench/tuning_budget.py --models {' '.join(args.models)} --minutes {' '.join(f'{m:g}' for m in args.minutes)}"
        + (f" --trials-cap {args.trials_cap}" if args.trials_cap else "") + f" --repeat {args.repeat}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; python {platform.python_version()}, "
        f"tvm {tvm.__version__}; date {time.strftime('%Y-%m-%d')}. Both engines run on {rows[0]['threads'] if rows else '?'} "
        "threads (onnxruntime: intra-op threads, one inter-op thread, sequential), same inputs (seed 0), timed side by side "
        "after all compiles. Every budget tunes into a fresh database; budget 0 is the untuned compile.", "",
        "| model | budget min | trials | trials/min | workloads (layers) | tuned / default kept / skipped | stage s | "
        "tvmsched p50 ms | onnxruntime p50 ms | tvmsched / ort |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["minutes"] <= 0:
            tuning = "| - | - | - | - | - "
        else:
            s = r["statuses"]
            hit = " (deadline)" if r["deadline_hit"] else ""
            tuning = (f"| {r['trials']} | {r['trials_per_min']:.1f} | {r['workloads']} ({r['layers']}) | "
                      f"{s['tuned']} / {s['default-kept']} / {s['skipped']} | {r['stage_s']:.0f}{hit} ")
        lines.append(f"| {r['model']} | {r['minutes']:g} {tuning}| {r['tvmsched_p50_ms']:.3f} | {r['onnxruntime_p50_ms']:.3f} | {r['ratio']:.2f}x |")
    lines += [
        "", "Trials/min counts MetaSchedule's measured candidates per minute inside the search; the stage also measures",
        "every workload's default schedule (the budget split's weights and the floor), seeds each search with it, and",
        "measures the tuned kernel against it (the faster is kept).",
    ]
    for model in dict.fromkeys(r["model"] for r in rows):
        tuned = [r for r in rows if r["model"] == model and r["minutes"] > 0]
        if not tuned:
            continue
        top = max(tuned, key=lambda r: r["minutes"])
        lines += ["", f"## {model}: workloads at {top['minutes']:g} min (heaviest default latency first)", "",
                  "| workload | layers | status | trials | s | default us | tuned us | kernel |", "|---|---|---|---|---|---|---|---|"]
        fmt = lambda us: "-" if us is None else f"{us:.4g}"  # noqa: E731
        for w in sorted(top["per_workload"], key=lambda w: -(w["default_us"] or 0) * w["layers"]):
            lines.append(f"| {w['func']} | {w['layers']} | {w['status']} | {w['trials']} | {w['seconds']:.0f} | "
                         f"{fmt(w['default_us'])} | {fmt(w['tuned_us'])} | {w['kernel']} |")
    out.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18-small", "bert-tiny"], help="Zoo names or ONNX files.")
    parser.add_argument("--minutes", nargs="+", type=float, default=[2, 5, 10, 30], help="Budgets (0 is always added).")
    parser.add_argument("--trials-cap", type=int, default=0, help="--tune-trials with the budget: trials per workload at most.")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", type=Path, default=RESULTS / "tuning_budget.md")
    parser.add_argument("--keep-db", type=Path, metavar="DIR",
                        help="Keep each budget's SQLite database in DIR (<model>-<M>min.db; default: a temporary folder).")
    args = parser.parse_args()
    if any(m < 0 for m in args.minutes):
        parser.error("budgets must be >= 0 minutes")
    budgets = sorted({0.0, *args.minutes})
    rows = []
    with tempfile.TemporaryDirectory(prefix="tvmsched-budget-") as tmp:
        folder = args.keep_db or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        for spec in args.models:
            rows += bench_model(spec, budgets, args.trials_cap, args.repeat, folder)
    raw = args.out.parent / "raw" / f"{args.out.stem}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(rows, indent=1))
    write_markdown(rows, args, args.out)
    print(f"wrote {args.out} and {raw}")


if __name__ == "__main__":
    main()
