"""Mechanism E at scale: the collectives simulator on MINA's setting and on a communication-heavy one.

    python bench/collectives_sim.py [--traces 1-10] [--jobs 1000] [--seed 0] [--workers 2] \
        [--out bench/results/raw/collectives_sim.json]
    python bench/collectives_sim.py --sweep [--traces 1,4,7] [--links 12.5,25,37.5,50,62.5,75,87.5,100,200] \
        [--jobs 1000] [--out bench/results/raw/collectives_sim_sweep.json]

Runs, for every host-count trace: each sharing policy with our placement and tree choice; the
SHARP-default baselines (exclusive and greedy with first-fit hosts and trees, MINA's baseline); the
ablation of tdm and mina (sharing alone, + locality placement, + least-load trees); and the same
policies in the comm-heavy preset. Writes the raw JSON and prints the Markdown tables
(bench/results/collectives.md).

`--sweep`: the comm-heavy preset at several link rates (`link_gbps`), tdm and exclusive with our
placement and trees plus exclusive with first-fit hosts and trees (SHARP's default), to see where
time-sharing gains most over the exclusive lock (default traces 1, 4, 7).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

POLICIES = ("exclusive", "greedy", "mina", "tdm", "spatial")
SEEDS = (1, 2, 3, 4)
ABLATION = (("first-fit", "first-fit", "sharing alone"), ("locality", "first-fit", "+ placement"),
            ("locality", "least-load", "+ tree choice"))
# MINA's published JCTScores (ClubieDong/MinaSimulator results/*.json, unweighted JCTScore): their ablation on
# trace 1, and per trace their baseline (greedy sharing, first-fit hosts and conflict-free first-fit trees) and MINA
MINA_PUBLISHED = {"sharing alone": 0.253, "+ placement": 0.549, "+ tree choice": 0.928}
MINA_BASELINE = (0.2531, 0.3883, 0.3612, 0.3164, 0.2453, 0.3883, 0.3642, 0.4259, 0.5185, 0.9296)
MINA_FULL = (0.9282, 0.8933, 0.8797, 0.8628, 0.9134, 0.8933, 0.9621, 0.9484, 0.9832, 0.9990)


def plan(traces: list[int], jobs: int, seed: int) -> list[dict]:
    """Every simulate() call of the benchmark, as keyword arguments."""
    runs = []
    for setting in ("mina", "comm-heavy"):
        for trace in traces:
            base = {"trace": trace, "jobs": jobs, "seed": seed, "setting": setting}
            runs += [{**base, "policy": p} for p in POLICIES]
            runs += [{**base, "policy": p, "placement": "first-fit", "tree": "first-fit"}
                     for p in ("exclusive", "greedy")]
            for placement, tree, _ in ABLATION[:2]:
                runs += [{**base, "policy": p, "placement": placement, "tree": tree} for p in ("tdm", "mina")]
    for s in SEEDS if traces[0] == 1 else ():  # seed sensitivity on trace 1
        base = {"trace": 1, "jobs": jobs, "seed": s, "setting": "mina"}
        runs += [{**base, "policy": "tdm"}, {**base, "policy": "mina"},
                 {**base, "policy": "exclusive", "placement": "first-fit", "tree": "first-fit"}]
    return runs


SWEEP_LINKS = (12.5, 25.0, 37.5, 50.0, 62.5, 75.0, 87.5, 100.0, 200.0)
SWEEP_CONFIGS = (("tdm", "locality", "least-load"), ("exclusive", "locality", "least-load"),
                 ("exclusive", "first-fit", "first-fit"))


def sweep_plan(traces: list[int], links: list[float], jobs: int, seed: int) -> list[dict]:
    """The simulate() calls of the comm-heavy link-rate sweep (tdm first: the slow ones start early)."""
    return [{"trace": t, "jobs": jobs, "seed": seed, "setting": "comm-heavy", "link_gbps": g, "policy": p,
             "placement": pl, "tree": tr} for p, pl, tr in SWEEP_CONFIGS for g in links for t in traces]


def sweep_table(results: list[dict]) -> str:
    """Average JCTs and exclusive/tdm ratios per link rate and trace (with a mean row per link rate)."""
    by = {(r["link_gbps"], r["trace"], r["policy"], r["placement"]): r for r in results}
    lines = ["| link (Gb/s) | trace | none avg JCT (s) | ideal | exclusive | exclusive (first-fit) | tdm | "
             "exclusive / tdm | exclusive (first-fit) / tdm |", "|---|---|---|---|---|---|---|---|---|"]
    for g in sorted({r["link_gbps"] for r in results}):
        rows = []
        for t in sorted({r["trace"] for r in results if r["link_gbps"] == g}):
            tdm, ex = by[g, t, "tdm", "locality"], by[g, t, "exclusive", "locality"]
            ff = by[g, t, "exclusive", "first-fit"]
            rows.append((t, tdm["avg_jct_none_s"], tdm["avg_jct_ideal_s"], ex["avg_jct_s"], ff["avg_jct_s"],
                         tdm["avg_jct_s"], ex["avg_jct_s"] / tdm["avg_jct_s"], ff["avg_jct_s"] / tdm["avg_jct_s"]))
        for t, *v in rows + [("mean", *[statistics.mean(r[i] for r in rows) for i in range(1, 8)])]:
            lines.append(f"| {g:g} | {t} | " + " | ".join(f"{x:.2f}" for x in v[:5]) +
                         f" | {v[5]:.3f}x | {v[6]:.3f}x |")
    return "\n".join(lines)


def _one(kwargs: dict) -> dict:
    from tvmsched.runtime.collectives.simulator import simulate

    start = time.perf_counter()
    result = simulate(**kwargs)
    return {**result, "wall_s": time.perf_counter() - start}


def run(traces: list[int], jobs: int, seed: int, workers: int, log=lambda text: None,
        runs: list[dict] | None = None) -> list[dict]:
    runs = plan(traces, jobs, seed) if runs is None else runs
    out = []
    with ProcessPoolExecutor(workers) as pool:
        for i, result in enumerate(pool.map(_one, runs), 1):
            log(f"[{i}/{len(runs)}] {result['setting']} {result['link_gbps']:g} Gb/s trace {result['trace']} "
                f"{result['policy']} {result['placement']}/{result['tree']}: JCTScore {result['jct_score']:.4f} "
                f"({result['wall_s']:.1f} s)")
            out.append(result)
    return out


def _pick(results, setting, policy, placement="locality", tree="least-load", seed=None):
    """{trace: result} of one configuration (the main seed unless `seed` is given)."""
    seed = min(r["seed"] for r in results) if seed is None else seed
    return {r["trace"]: r for r in results if r["setting"] == setting and r["policy"] == policy
            and r["placement"] == placement and r["tree"] == tree and r["seed"] == seed}


def seed_table(results: list[dict]) -> str:
    seeds = sorted({r["seed"] for r in results if r["trace"] == 1 and r["setting"] == "mina"})
    cols = (("exclusive", "first-fit", "first-fit"), ("mina", "locality", "least-load"),
            ("tdm", "locality", "least-load"))
    lines = ["| seed | exclusive (first-fit) | mina-score | tdm |", "|---|---|---|---|"]
    for s in seeds:
        vals = [_pick(results, "mina", *c, seed=s).get(1) for c in cols]
        if all(vals):
            lines.append(f"| {s} | " + " | ".join(f"{v['jct_score']:.3f}" for v in vals) + " |")
    return "\n".join(lines)


def score_table(results: list[dict], setting: str, key: str = "jct_score", fmt: str = "{:.3f}") -> str:
    cols = [(p, "locality", "least-load") for p in POLICIES] + [("exclusive", "first-fit", "first-fit"),
                                                                ("greedy", "first-fit", "first-fit")]
    picked = [_pick(results, setting, *c) for c in cols]
    traces = sorted(picked[0])
    head = ["trace"] + [p if pl == "locality" else f"{p} (first-fit)" for p, pl, _ in cols]
    if key == "avg_jct_s":
        head[1:1] = ["none", "ideal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in traces + ["mean"]:
        vals = [statistics.mean(p[x][key] for x in traces) if t == "mean" else p[t][key] for p in picked]
        if key == "avg_jct_s":
            ref = picked[0]
            vals[0:0] = [statistics.mean(ref[x][k] for x in traces) if t == "mean" else ref[t][k]
                         for k in ("avg_jct_none_s", "avg_jct_ideal_s")]
        lines.append(f"| {t} | " + " | ".join(fmt.format(v) for v in vals) + " |")
    return "\n".join(lines)


def ablation_table(results: list[dict], setting: str = "mina") -> str:
    lines = ["| step | placement / tree | tdm (trace 1) | tdm (mean of traces) | mina-score (trace 1) | "
             "mina-score (mean) | MINA published (trace 1) |", "|---|---|---|---|---|---|---|"]
    for placement, tree, name in ABLATION:
        row = [name, f"{placement} / {tree}"]
        for policy in ("tdm", "mina"):
            picked = _pick(results, setting, policy, placement, tree)
            row += [f"{picked[1]['jct_score']:.3f}" if 1 in picked else "-",
                    f"{statistics.mean(r['jct_score'] for r in picked.values()):.3f}"]
        row.append(f"{MINA_PUBLISHED[name]:.3f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def ratio_table(results: list[dict], setting: str = "comm-heavy") -> str:
    tdm = _pick(results, setting, "tdm")
    ex = _pick(results, setting, "exclusive")
    ex_ff = _pick(results, setting, "exclusive", "first-fit", "first-fit")
    lines = ["| trace | none avg JCT (s) | ideal | exclusive | tdm | exclusive / tdm | "
             "exclusive first-fit (SHARP default) | SHARP default / tdm |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for t in sorted(tdm):
        rows.append((t, tdm[t]["avg_jct_none_s"], tdm[t]["avg_jct_ideal_s"], ex[t]["avg_jct_s"], tdm[t]["avg_jct_s"],
                     ex[t]["avg_jct_s"] / tdm[t]["avg_jct_s"], ex_ff[t]["avg_jct_s"],
                     ex_ff[t]["avg_jct_s"] / tdm[t]["avg_jct_s"]))
    for t, *v in rows + [("mean", *[statistics.mean(r[i] for r in rows) for i in range(1, 8)])]:
        lines.append(f"| {t} | {v[0]:.2f} | {v[1]:.2f} | {v[2]:.2f} | {v[3]:.2f} | {v[4]:.3f}x | {v[5]:.2f} | "
                     f"{v[6]:.3f}x |")
    return "\n".join(lines)


def published_table(results: list[dict]) -> str:
    ours = {name: _pick(results, "mina", *cfg) for name, cfg in
            (("ex", ("exclusive", "first-fit", "first-fit")), ("tdm", ("tdm",)), ("mina", ("mina",)))}
    lines = ["| trace | MINA baseline (published) | exclusive, first-fit (ours) | MINA (published) | "
             "tdm (ours) | mina-score (ours) |", "|---|---|---|---|---|---|"]
    traces = sorted(ours["tdm"])
    rows = [(t, MINA_BASELINE[t - 1], ours["ex"][t]["jct_score"], MINA_FULL[t - 1], ours["tdm"][t]["jct_score"],
             ours["mina"][t]["jct_score"]) for t in traces]
    for t, *v in rows + [("mean", *[statistics.mean(r[i] for r in rows) for i in range(1, 6)])]:
        lines.append(f"| {t} | " + " | ".join(f"{x:.3f}" for x in v) + " |")
    return "\n".join(lines)


def report(results: list[dict]) -> str:
    parts = ["### Against MINA's published JCTScores (setting mina)", published_table(results)]
    for setting in ("mina", "comm-heavy"):
        parts += [f"### JCTScore, setting {setting}", score_table(results, setting),
                  f"### Average JCT (s), setting {setting}", score_table(results, setting, "avg_jct_s", "{:.3f}"),
                  f"### Ablation, setting {setting}", ablation_table(results, setting)]
    parts += ["### Comm-heavy: exclusive vs tdm", ratio_table(results),
              "### Seed sensitivity (setting mina, trace 1, JCTScore)", seed_table(results)]
    return "\n\n".join(parts)


def _traces(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(t) for t in text.split(",")]


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    parser = argparse.ArgumentParser()
    parser.add_argument("--traces", default=None, help="default 1-10, or 1,4,7 with --sweep")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=None, help="default bench/results/raw/collectives_sim[_sweep].json")
    parser.add_argument("--sweep", action="store_true", help="comm-heavy link-rate sweep of tdm vs exclusive")
    parser.add_argument("--links", default=",".join(f"{g:g}" for g in SWEEP_LINKS), help="Gb/s, with --sweep")
    args = parser.parse_args()
    traces = _traces(args.traces or ("1,4,7" if args.sweep else "1-10"))
    out = args.out or f"bench/results/raw/collectives_sim{'_sweep' if args.sweep else ''}.json"
    log = lambda t: print(t, file=sys.stderr)  # noqa: E731
    start = time.perf_counter()
    if args.sweep:
        runs = sweep_plan(traces, [float(g) for g in args.links.split(",")], args.jobs, args.seed)
        results = run(traces, args.jobs, args.seed, args.workers, log=log, runs=runs)
    else:
        results = run(traces, args.jobs, args.seed, args.workers, log=log)
    meta = {"date": datetime.date.today().isoformat(), "machine": platform.node(), "python": platform.python_version(),
            "command": "python " + " ".join(sys.argv), "wall_s": time.perf_counter() - start}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    # JCTScore is 0/0 (NaN) where none == ideal (fast links in --sweep): written as null, not as invalid JSON
    clean = [{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in r.items()} for r in results]
    Path(out).write_text(json.dumps({**meta, "results": clean}, indent=1, allow_nan=False))
    print(sweep_table(results) if args.sweep else report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
