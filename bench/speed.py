"""Speed benchmark (issue 16, bench/results/speed.md): tvmsched against onnxruntime on CPU, side by side in one
run with the same thread count for both engines, each engine in its own fresh process.

    python bench/speed.py [--models a,b,c] [--threads N] [--repeat 30]                  # untuned
    python bench/speed.py --tuned resnet18-small,bert-tiny,resnet50 --tune-minutes 30     # tuned rows too
    python bench/speed.py --report                                                      # markdown from the raw JSON only

Untuned: per model (the bundled zoo, plus `tvmsched.models.REAL_MODELS` when that registry exists), compile
seconds (compile_file alone, default schedules, in a fresh process), tvmsched p50, onnxruntime p50 and their ratio;
then the median and the largest ratio against the goals (median <= 3x, none above 6x) and compile seconds
against today's (--baseline-json, taken from bench/results/compile.md; goal <= 2x).
Tuned: `tvmsched compile --tune-minutes N` of the --tuned models into a tuning database of this benchmark
(--records-only: `tvmsched compile --db` from a database already tuned), tuned p50 against onnxruntime p50
(goal <= 1.0x), with the default schedules' p50 timed in the same run.

Resumable: every finished model is written to the raw JSON at once (--raw), and a later run skips the models
already there (--redo M1,M2 or --fresh measures them again). Work files (ONNX, artifacts, the tuning database)
stay in --work so that an interrupted tuned compile resumes from its database records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ChildFailed, compile_in_child, machine_info, machine_line, measure_engine, write_json_atomic  # noqa: E402

HERE = Path(__file__).parent
ROOT = HERE.parent
RESULTS = HERE / "results"
GOAL_MEDIAN, GOAL_MAX, GOAL_COMPILE, GOAL_TUNED = 3.0, 6.0, 2.0, 1.0


# -- the models -----------------------------------------------------------------------------------------------

def registries(include_slow: bool = True) -> dict[str, str]:
    """Every model this benchmark can run: name -> "zoo" or "real"; real models marked slow only if asked."""
    from tvmsched import models

    names = {name: "zoo" for name in models.MODELS}
    for name, spec in models.REAL_MODELS.items():
        if include_slow or not getattr(spec, "slow", False):
            names.setdefault(name, "real")
    return names


def choose_models(arg: str | None, known: dict[str, str]) -> list[str]:
    if not arg:
        return list(known)
    chosen = [name.strip() for name in arg.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        sys.exit(f"unknown models {unknown}; known: {', '.join(known)}")
    return chosen


# -- baseline: today's compile seconds ------------------------------------------------------------------------

def baseline_from_markdown(path: Path) -> dict:
    """{model: compile_s} from the table of bench/results/compile.md (its 'compile s' column)."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    model_col, compile_col = header.index("model"), header.index("compile s")
    out = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == len(header) and re.fullmatch(r"[0-9.]+", cells[compile_col]):
            out[cells[model_col]] = float(cells[compile_col])
        elif len(cells) != len(header):
            break  # the next table (GPU) starts
    return out


def load_baseline(path: Path) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"source": "none", "compile_s": {}}


# -- one model ------------------------------------------------------------------------------------------------

def untuned_row(name: str, registry: str, args) -> dict:
    work = args.work
    artifact, inputs = work / f"{name}.tvms", work / f"{name}.inputs.npz"
    inputs.unlink(missing_ok=True)  # drawn afresh: by the compile child (real models) or the tvmsched child (zoo)
    row: dict = {"model": name, "registry": registry, "threads": args.threads}
    try:
        row.update(compile_in_child(name, registry, work / f"{name}.onnx", artifact, target=args.target,
                                    threads=args.threads, timeout=args.compile_timeout, inputs_path=inputs))
    except ChildFailed as err:
        row["error"] = f"compile: {err}"
        return row
    return side_by_side(row, artifact, inputs, args)


def side_by_side(row: dict, artifact: Path, inputs: Path, args) -> dict:
    """tvmsched on `artifact`, then onnxruntime on the row's ONNX file: same inputs, same threads."""
    for engine, path in (("tvmsched", artifact), ("onnxruntime", Path(row["onnx"]))):
        try:
            row[engine] = measure_engine(engine, path, args.repeat, args.threads, inputs, args.max_seconds,
                                         timeout=args.run_timeout)
        except ChildFailed as err:
            row["error"] = f"{engine}: {err}"
            return row
    row["ratio_p50"] = row["tvmsched"]["p50_ms"] / row["onnxruntime"]["p50_ms"]
    return row


def run_teeing_stderr(command: list[str], env: dict) -> tuple[int, str, str]:
    """Run `command` showing its stderr (the tuning progress) as it comes; its exit code, stdout, stderr's tail."""
    import threading

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    stdout: list[bytes] = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)
    reader.start()
    tail = b""
    for chunk in iter(lambda: proc.stderr.read1(4096), b""):
        sys.stderr.buffer.write(chunk)
        sys.stderr.flush()
        tail = (tail + chunk)[-4000:]
    reader.join()
    return proc.wait(), b"".join(stdout).decode(errors="replace"), tail.decode(errors="replace")


def tuned_row(name: str, registry: str, args) -> dict:
    """Tune-compile with the CLI (as a user would), then the tuned artifact, onnxruntime and the default
    schedules' artifact side by side in this run."""
    work = args.work
    artifact, default, inputs = work / f"{name}-tuned.tvms", work / f"{name}-default.tvms", work / f"{name}.inputs.npz"
    row: dict = {"model": name, "registry": registry, "threads": args.threads, "db": args.tune_db}
    try:  # the ONNX file, the inputs (the untuned row's, or drawn here) and the default schedules' artifact
        row.update(compile_in_child(name, registry, work / f"{name}.onnx", default, target=args.target,
                                    threads=args.threads, inputs_path=inputs if registry == "real" else None))
    except ChildFailed as err:
        row["error"] = f"build: {err}"
        return row
    budget = ["--tune-minutes", f"{args.tune_minutes:g}"]
    row["budget"] = f"{args.tune_minutes:g} min"
    if args.records_only:  # the database holds a --tune-minutes run's records: --db alone compiles from them
        budget = []
        row["budget"] = f"{args.tune_minutes:g} min (its records)"
    shapes = [f"--input-shape={k}={','.join(map(str, v))}" for k, v in (row.get("input_shapes") or {}).items()]
    command = [sys.executable, "-m", "tvmsched.cli", "compile", row["onnx"], "-o", str(artifact), "--target",
               args.target, *shapes, *budget, "--db", args.tune_db]
    row["command"] = shlex.join(["tvmsched", *command[3:]])
    env = {**os.environ, "TVM_NUM_THREADS": str(args.threads)}
    print(f"  {row['command']}", flush=True)
    start = time.perf_counter()
    returncode, stdout, stderr_tail = run_teeing_stderr(command, env)
    row["tune_wall_s"] = time.perf_counter() - start
    row["compile_output"] = [line for line in stdout.splitlines() if line.startswith(("tuning:", "wrote"))]
    if returncode != 0:
        last = [line for line in stderr_tail.replace("\r", "\n").splitlines() if line.strip()][-1:] or [""]
        row["error"] = f"tuned compile: exit {returncode}: {last[0][-400:]}"
        return row
    row = side_by_side(row, artifact, inputs, args)
    if "error" not in row:  # the default schedules timed in this run too: milliseconds across runs do not compare
        try:
            row["default"] = measure_engine("tvmsched", default, args.repeat, args.threads, inputs, args.max_seconds,
                                            timeout=args.run_timeout)
        except ChildFailed as err:
            row["error"] = f"default schedules: {err}"
    return row


# -- the report -----------------------------------------------------------------------------------------------

def compile_ratio(row: dict, baseline: dict) -> float | None:
    """Compile seconds against today's: both from the baseline file where it timed this tree beside the earlier
    one (bench/compile_then_now.py: same machine, same run), else this row's against the file's."""
    name, then = row["model"], baseline.get("compile_s", {}).get(row["model"])
    now = baseline.get("compile_s_now", {}).get(name, row.get("compile_s"))
    return now / then if then and now else None


def goals(raw: dict) -> dict:
    """Median and largest untuned ratio, compile seconds against today's, tuned ratios; each against its goal."""
    rows = [r for r in raw["untuned"].values() if "ratio_p50" in r]
    ratios = {r["model"]: r["ratio_p50"] for r in rows}
    compile_ratios = {r["model"]: ratio for r in rows if (ratio := compile_ratio(r, raw.get("baseline", {})))}
    tuned = {r["model"]: r["ratio_p50"] for r in raw["tuned"].values() if "ratio_p50" in r}
    out = {"models": len(ratios), "failed": sorted(m for m, r in raw["untuned"].items() if "error" in r)}
    if ratios:
        worst = max(ratios, key=ratios.get)
        out.update(median_ratio=statistics.median(ratios.values()), max_ratio=ratios[worst], max_model=worst,
                   above_max=sorted(m for m, v in ratios.items() if v > GOAL_MAX))
        out["median_ok"], out["max_ok"] = out["median_ratio"] <= GOAL_MEDIAN, out["max_ratio"] <= GOAL_MAX
    if compile_ratios:
        worst = max(compile_ratios, key=compile_ratios.get)
        out.update(compile_max_ratio=compile_ratios[worst], compile_max_model=worst,
                   compile_ok=compile_ratios[worst] <= GOAL_COMPILE)
    if tuned:
        out["tuned"] = {m: {"ratio": v, "ok": v <= GOAL_TUNED} for m, v in tuned.items()}
    return out


def _ok(flag: bool) -> str:
    return "met" if flag else "**not met**"


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 100 else f"{value:.3f}" if value >= 0.01 else f"{value:.2g}"


def markdown(raw: dict, prose: str | None = None) -> str:
    meta = raw["meta"]
    g = goals(raw)
    lines = [
        "# Speed: tvmsched against onnxruntime on CPU (issue 16)", "",
        f"Command: `{meta['command']}`  ",
        machine_line(meta["machine"]) + "  ",
        f"Both engines: {meta['threads']} threads (onnxruntime intra-op {meta['threads']}, inter-op 1, sequential), "
        "the same seeded inputs, each engine in its own fresh process; p50/p99 over up to "
        f"{meta['repeat']} timed runs (at most ~{meta['max_seconds']:g} s of runs per engine and model) after warm-up. "
        "tvmsched times the layers in its engine with the inputs in place; onnxruntime times `session.run`.",
        "",
        "## Untuned (default schedules)", "",
        "Compile s: `compile_file` alone in a fresh process (ONNX → artifact, no tuning). Today's: "
        f"{raw.get('baseline', {}).get('source', 'none')}.",
        "",
        "| model | kind | layers | compile s | today's compile s (ratio) | tvmsched p50 ms | onnxruntime p50 ms | tvmsched/ort p50 | tvmsched p99 ms | onnxruntime p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    baseline = raw.get("baseline", {}).get("compile_s", {})
    for name, r in raw["untuned"].items():
        today = f"{baseline[name]:.1f}" if name in baseline else "–"
        if (ratio := compile_ratio({**r, "model": name}, raw.get("baseline", {}))) is not None:
            today += f" ({ratio:.1f}x)"
        if "error" in r:
            compiled = f"{r['compile_s']:.1f}" if "compile_s" in r else "–"
            lines.append(f"| {name} | {r['registry']} | {r.get('layers', '–')} | {compiled} | {today} | "
                         f"failed: {r['error'][:160].replace('|', '/')} | | | | |")
            continue
        t, o = r["tvmsched"], r["onnxruntime"]
        lines.append(f"| {name} | {r['registry']} | {r['layers']} | {r['compile_s']:.1f} | {today} | {_ms(t['p50_ms'])} | "
                     f"{_ms(o['p50_ms'])} | {r['ratio_p50']:.2f}x | {_ms(t['p99_ms'])} | {_ms(o['p99_ms'])} |")
    lines.append("")
    if "median_ratio" in g:
        lines += [
            f"- Median tvmsched/onnxruntime p50 over {g['models']} models: **{g['median_ratio']:.2f}x** "
            f"(goal ≤ {GOAL_MEDIAN:g}x: {_ok(g['median_ok'])}).",
            f"- Largest: **{g['max_ratio']:.2f}x** ({g['max_model']}) (goal: none above {GOAL_MAX:g}x: {_ok(g['max_ok'])}"
            + (f"; above it: {', '.join(g['above_max'])}" if g["above_max"] else "") + ").",
        ]
    if "compile_max_ratio" in g:
        lines.append(f"- Compile seconds against today's: largest {g['compile_max_ratio']:.2f}x ({g['compile_max_model']}) "
                     f"(goal ≤ {GOAL_COMPILE:g}x: {_ok(g['compile_ok'])}).")
    if g["failed"]:
        lines.append(f"- Failed: {', '.join(g['failed'])} (reason in the table; raw: bench/results/raw/speed.json).")
    lines += ["", "## Tuned", ""]
    if raw["tuned"]:
        lines += ["| model | budget | tune wall s | untuned p50 ms (same run) | tuned p50 ms | onnxruntime p50 ms | tuned/ort p50 | goal ≤ 1.0x |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r in raw["tuned"].items():
            untuned = r.get("default", {}).get("p50_ms")  # this run's (not the untuned table's: another run)
            untuned_text = _ms(untuned) if untuned else "–"
            if "error" in r:
                lines.append(f"| {name} | {r.get('budget', '–')} | {r.get('tune_wall_s', 0):.0f} | {untuned_text} | "
                             f"failed: {r['error'][:160].replace('|', '/')} | | | |")
                continue
            lines.append(f"| {name} | {r['budget']} | {r['tune_wall_s']:.0f} | {untuned_text} | {_ms(r['tvmsched']['p50_ms'])} | "
                         f"{_ms(r['onnxruntime']['p50_ms'])} | {r['ratio_p50']:.2f}x | {_ok(r['ratio_p50'] <= GOAL_TUNED)} |")
        commands = sorted({r["command"] for r in raw["tuned"].values() if "command" in r})
        if commands:
            lines += ["", "Tuned with " + "; ".join(f"`{c}`" for c in commands[:1]) + (" (and likewise for the others)." if len(commands) > 1 else ".")]
    else:
        lines.append("Not run yet: `python bench/speed.py --tuned resnet18-small,bert-tiny,MODEL --tune-minutes 30`.")
    return "\n".join(lines) + "\n\n" + (prose or PROSE_PLACEHOLDER)


PROSE_PLACEHOLDER = """## GPU

Not measured by this script (CPU only); the GPU rows against PyTorch come from a GPU machine.

## Reading

_To be written from the numbers above: where the ratio comes from per kind of model (convolutions, depthwise,
transformers), what tuning bought, and what is left._
"""


def written_prose(out: Path) -> str | None:
    """The hand-written sections of an existing report (from "## GPU" on), kept when the tables are rewritten."""
    text = out.read_text() if out.exists() else ""
    start = text.find("## GPU")
    prose = text[start:] if start >= 0 else ""
    return prose if prose and "_To be written" not in prose else None


# -- main -----------------------------------------------------------------------------------------------------

def load_raw(path: Path, fresh: bool) -> dict:
    if path.exists() and not fresh:
        raw = json.loads(path.read_text())
        raw.setdefault("untuned", {}), raw.setdefault("tuned", {})
        return raw
    return {"meta": {}, "untuned": {}, "tuned": {}}


def progress(index: int, total: int, section: str, row: dict, started: float) -> None:
    elapsed = time.perf_counter() - started
    head = f"[{index}/{total}] {section} {row['model']}"
    if "error" in row:
        print(f"{head}: FAILED {row['error'][:400]}  ({elapsed:.0f} s)", flush=True)
        return
    compile_text = f"tuned in {row['tune_wall_s']:.0f} s" if "tune_wall_s" in row else f"compile {row['compile_s']:.1f} s"
    print(f"{head}: {compile_text}, tvmsched {_ms(row['tvmsched']['p50_ms'])} ms, onnxruntime "
          f"{_ms(row['onnxruntime']['p50_ms'])} ms -> {row['ratio_p50']:.2f}x  ({elapsed:.0f} s)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", help="Comma-separated models for the untuned section (default: zoo + real registry).")
    parser.add_argument("--no-slow", action="store_true", help="Default list without the real models marked slow.")
    parser.add_argument("--skip-untuned", action="store_true", help="Only the --tuned models.")
    parser.add_argument("--tuned", help="Comma-separated models to tune and compare (e.g. resnet18-small,bert-tiny,resnet50).")
    parser.add_argument("--tune-minutes", type=float, default=30.0, help="Tuning budget per model (compile --tune-minutes).")
    parser.add_argument("--tune-db", help="Tuning database (default: sqlite:///WORK/tuning.db, this benchmark's own).")
    parser.add_argument("--records-only", action="store_true",
                        help="--tune-db already holds a --tune-minutes run of the model (bench/tuning_budget.py --keep-db): "
                             "compile from its records without searching, time side by side.")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="Threads of both engines.")
    parser.add_argument("--repeat", type=int, default=30, help="Timed runs per engine (fewer for slow models, --max-seconds).")
    parser.add_argument("--max-seconds", type=float, default=20.0, help="About this many seconds of timed runs per engine (0: no cap).")
    parser.add_argument("--target", default="llvm", help="Compile target (default llvm: the host CPU).")
    parser.add_argument("--compile-timeout", type=float, default=3600.0, help="Seconds before an untuned compile counts as failed.")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="Seconds before an engine's timing counts as failed.")
    parser.add_argument("--baseline-json", type=Path, default=RESULTS / "raw" / "compile_baseline.json",
                        help="Today's compile seconds per model: {'source': ..., 'compile_s': {model: s}}.")
    parser.add_argument("--write-baseline", type=Path, metavar="COMPILE_MD",
                        help="Write --baseline-json from this compile benchmark table (bench/results/compile.md) and exit.")
    parser.add_argument("--raw", type=Path, default=RESULTS / "raw" / "speed.json", help="Raw results (resumed from).")
    parser.add_argument("--out", type=Path, default=RESULTS / "speed.md")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "speed", help="ONNX files, artifacts, tuning DB.")
    parser.add_argument("--redo", help="Comma-separated models to measure again even if the raw JSON has them.")
    parser.add_argument("--fresh", action="store_true", help="Ignore the raw JSON: measure everything again.")
    parser.add_argument("--report", action="store_true", help="Only write the markdown from the raw JSON.")
    args = parser.parse_args()

    if args.write_baseline:
        compile_s = baseline_from_markdown(args.write_baseline)
        write_json_atomic(args.baseline_json, {"source": f"{args.write_baseline} at git {machine_info()['git']} "
                                               "(bench/compile_bench.py, default schedules)", "compile_s": compile_s})
        print(f"wrote {args.baseline_json}: {compile_s}")
        return
    raw = load_raw(args.raw, args.fresh)
    if args.report:  # the tables again, against the baseline file as it is now
        raw["baseline"] = load_baseline(args.baseline_json)
        args.out.write_text(markdown(raw, written_prose(args.out)))
        print(f"wrote {args.out}")
        return

    known = registries()
    untuned = [] if args.skip_untuned else choose_models(args.models, known if args.models else registries(not args.no_slow))
    tuned = choose_models(args.tuned, known) if args.tuned else []
    redo = set(choose_models(args.redo, known)) if args.redo else set()
    args.work.mkdir(parents=True, exist_ok=True)
    args.tune_db = args.tune_db or f"sqlite:///{(args.work / 'tuning.db').resolve()}"
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:])
    raw["meta"] = {"command": f"python bench/speed.py {argv}".strip(), "machine": machine_info(), "threads": args.threads,
                   "repeat": args.repeat, "max_seconds": args.max_seconds, "target": args.target}
    raw["baseline"] = load_baseline(args.baseline_json)

    def save() -> None:
        write_json_atomic(args.raw, raw)
        args.out.write_text(markdown(raw, written_prose(args.out)))

    started = time.perf_counter()
    plan = [("untuned", m) for m in untuned] + [("tuned", m) for m in tuned]
    for index, (section, name) in enumerate(plan, 1):
        done = raw[section].get(name)
        if done and "error" not in done and name not in redo and done.get("threads") == args.threads:
            print(f"[{index}/{len(plan)}] {section} {name}: already in {args.raw} (--redo {name} measures it again)", flush=True)
            continue
        print(f"[{index}/{len(plan)}] {section} {name} ...", flush=True)
        row = (untuned_row if section == "untuned" else tuned_row)(name, known[name], args)
        row["date"] = time.strftime("%Y-%m-%d %H:%M")
        raw[section][name] = row
        save()
        progress(index, len(plan), section, row, started)
    save()
    g = goals(raw)
    if "median_ratio" in g:
        print(f"untuned: median {g['median_ratio']:.2f}x (goal <= {GOAL_MEDIAN:g}x), max {g['max_ratio']:.2f}x on "
              f"{g['max_model']} (goal <= {GOAL_MAX:g}x)" + (f", compile max {g['compile_max_ratio']:.2f}x of today's "
                                                            f"on {g['compile_max_model']}" if "compile_max_ratio" in g else ""))
    for name, t in g.get("tuned", {}).items():
        print(f"tuned {name}: {t['ratio']:.2f}x onnxruntime (goal <= {GOAL_TUNED:g}x)")
    print(f"wrote {args.raw} and {args.out}")


if __name__ == "__main__":
    main()
