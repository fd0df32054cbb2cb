"""K rounds of N samples (tune kit -> tune measure -> tune import, seeded search from round 2) against one kit of
K*N random samples, on this CPU (llvm), each arm with its own fresh database.

    python bench/tuning_rounds.py --model mlp --rounds 4 --samples 8 [--out bench/results/tuning_rounds.md]

Per round: the sum over the model's distinct workloads of the best measured time in the database, the seconds the
kit took to build here and the seconds its measurement took (what a device round costs, without the process
start). At the end, each arm's best schedule per workload is timed again side by side (one module, in turns), so
the final comparison does not depend on when each arm measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))


def best_per_workload(database, funcs, target) -> dict:
    """{workload representative: (best record's mean us, its trace)} in `database`'s scope."""
    from tvmsched.tune import search as tuning

    out = {}
    for w in tuning.group_workloads(funcs):
        record = database.query_tuning_record(tuning.task_module(w.func), target, "main")
        if record is not None:
            out[w.name] = (float(sum(record.run_secs) / len(record.run_secs)) * 1e6, record.trace)
    return out


def run_arm(model, tmp: Path, name: str, rounds: list[tuple[int, bool]], measured_ratio: float = 0.2) -> dict:
    """Kits of (samples, seeded) in turn, each measured at all units and imported into the arm's own database."""
    from tvmsched.tune.kit_build import build_kit, import_results
    from tvmsched.pipeline import lower_model, open_tuning_database
    from tvmsched.tune.kit_run import measure_kit

    db_url = f"sqlite:///{tmp / name}.db"
    _, funcs, target = lower_model(model, "llvm", None)
    rows = []
    for r, (samples, seeded) in enumerate(rounds, 1):
        kit_dir = tmp / f"{name}-{r}"
        start = time.perf_counter()
        kit = build_kit(model, kit_dir, target="llvm", samples=samples, progress=False, database=db_url, seeded=seeded,
                        measured_ratio=measured_ratio)
        built = time.perf_counter() - start
        start = time.perf_counter()
        results = measure_kit(kit_dir, "all", progress=False)
        measured = time.perf_counter() - start
        stored = import_results(kit_dir, results, db_url)
        best = best_per_workload(open_tuning_database(db_url, target), funcs, target)
        rows.append({"round": kit["round"], "kernels": stored, "build_s": built, "measure_s": measured,
                     "best_sum_us": sum(us for us, _ in best.values()), "best": best,
                     "seeded": sum(1 for e in kit["funcs"] if e.get("seeded"))})
        print(f"{name} round {r}: {stored} kernels, build {built:.1f} s, measure {measured:.2f} s, "
              f"sum of workload bests {rows[-1]['best_sum_us']:.2f} us", file=sys.stderr, flush=True)
    return {"rows": rows, "funcs": funcs, "target": target}


def side_by_side(arms: dict, model) -> dict:
    """Each arm's final best schedule per workload, timed again together: {arm: {workload: us}}."""
    from tvmsched.tune import search as tuning
    from tvmsched.tune.candidates import cpu_units
    from tvmsched.lower.layers import arg_specs
    from tvmsched.tune.local_timing import measure_together
    from tvmsched.pipeline import lower_model

    graph, funcs, target = lower_model(model, "llvm", None)
    specs = arg_specs(graph)
    entries, keys = [], []
    for arm, data in arms.items():
        for workload, (_, trace) in data["rows"][-1]["best"].items():
            entries.append((tuning.replay(funcs[workload], trace), specs[workload]))
            keys.append((arm, workload))
    times = measure_together(entries, target, cpu_units(target), repeat=15, min_repeat_ms=20)
    out: dict = {arm: {} for arm in arms}
    for (arm, workload), us in zip(keys, times):
        out[arm][workload] = us
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--measured-ratio", type=float, default=0.2, help="share of the search's first population from the database")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from tvmsched import models

    model = models.build(args.model)
    with tempfile.TemporaryDirectory(prefix="tuning-rounds-") as tmp:
        arms = {
            "rounds": run_arm(model, Path(tmp), "rounds", [(args.samples, True)] * args.rounds, args.measured_ratio),
            "one kit": run_arm(model, Path(tmp), "one-kit", [(args.samples * args.rounds, False)]),
        }
        again = side_by_side(arms, model)
    lines = [
        f"# Tuning in rounds vs one random kit ({args.model}, llvm, this CPU)", "",
        f"Command: `python bench/tuning_rounds.py --model {args.model} --rounds {args.rounds} --samples {args.samples} "
        f"--measured-ratio {args.measured_ratio}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, {platform.platform()}; python {platform.python_version()}; "
        f"date {time.strftime('%Y-%m-%d')}. Measured with `tune measure --units all`'s code (the engine's kernel timer) in "
        "this process, full TVM; each arm with a fresh database.", "",
        "| arm | round | kernels measured | layers seeded | kit build s | measure s | sum of workload bests (us) |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, data in arms.items():
        for row in data["rows"]:
            lines.append(f"| {arm} | {row['round']} | {row['kernels']} | {row['seeded']} | {row['build_s']:.1f} | "
                         f"{row['measure_s']:.2f} | {row['best_sum_us']:.3f} |")
    lines += ["", "Final bests timed again side by side (us, median of 15 batches of >= 20 ms, in turns):", "",
              "| workload | rounds | one kit |", "|---|---|---|"]
    for workload in sorted(set(again["rounds"]) | set(again["one kit"])):
        cells = [f"{again[arm][workload]:.3f}" if workload in again[arm] else "-" for arm in ("rounds", "one kit")]
        lines.append(f"| {workload} | {cells[0]} | {cells[1]} |")
    totals = [sum(again[arm].values()) for arm in ("rounds", "one kit")]
    lines.append(f"| **sum** | **{totals[0]:.3f}** | **{totals[1]:.3f}** |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
