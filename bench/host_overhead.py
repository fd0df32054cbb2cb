"""Host cost of one request from Python (issue 28, item 4): `Runtime.submit(...).result()` against a direct run of
the same 64-layer chain (`Executor.run`), with and without many live Python objects, and the garbage collections
that land inside requests.

    python bench/host_overhead.py --code before=/tmp/base:off --code after=:off,on --out bench/results/raw/host_overhead.json

Each scenario runs in a fresh child process (gc.freeze() is process-wide), scenarios alternate and repeat. Inside a
child the three paths run interleaved, in rounds of alternating order:
    direct   Executor.run(inputs) on the calling thread (no stream, no policy)
    engine   the stream's own hand-off with no Python around it: Stream.submit + Request.wait + outputs
    submit   Runtime.submit(model, inputs).result() (policy, future, numpy conversions)
A gc.callbacks hook records every collection; one whose start lies between a request's first and last instant is
"inside" it. The engine's timestamps split each stream request into "in the stream" (queued to done) and "outside
the stream" (Python before the queue, the caller's wake-up and Python after the end). Between requests the client
drops `--client-garbage` self-referencing objects (only the collector frees them, so collections fall due all the
time); in the "heap" scenarios it also allocated `--live` tracked objects before loading (a server's heap: a gen-2
collection scans them all) and keeps `--client-keep` more per request (a log that grows, so gen-2 collections come
due). RSS is read before and after the timed part.

`--code NAME=WHERE:FREEZE` (repeatable) runs the children on a copy of the package with the freeze_gc settings
FREEZE ("off", "on" or "off,on"), so code before and after a change is measured in the same run, interleaved.
WHERE: empty (this checkout), a folder laid out as installed (tvmsched/, tvmsched/runtime/, ...), or git:COMMIT
(that commit's Python, laid out in a temporary folder, with this checkout's built engine):
    --code before=git:HEAD:off --code after=:off,on
"""

from __future__ import annotations

import argparse
import atexit
import collections
import gc
import inspect
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import _common  # noqa: E402  (bench/ is not a package)

WAYS = ("direct", "engine", "submit")


class _Node:
    pass


def _client_work(garbage: int, keep: int, log: list) -> None:
    """What a client does between two requests: `garbage` objects only the collector frees, `keep` kept for ever."""
    for _ in range(garbage):
        node = _Node()
        node.me = node
    if keep:
        log.append([[] for _ in range(keep - 1)])


def chain_artifact(out_dir: Path, layers: int = 64, size: int = 8) -> Path:
    """64 MatMuls of [1, 8] x [8, 8] (bench/engine.py's chain): each its own layer and ~0.1 µs of work, so a run is
    almost all host cost. (An Add/Relu chain would fuse into one layer.)"""
    from engine import compile_chain  # bench/engine.py

    return compile_chain(out_dir, layers, size)


def _rss_mb() -> float:
    line = next(line for line in open("/proc/self/status") if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def _summary(us: np.ndarray) -> dict:
    return {"p50_us": float(np.percentile(us, 50)), "p90_us": float(np.percentile(us, 90)),
            "p99_us": float(np.percentile(us, 99)), "max_us": float(us.max()), "mean_us": float(us.mean()), "n": len(us)}


def measure(spec: dict) -> dict:
    """One scenario in this process: the three paths interleaved; latencies (µs) and the collections inside them."""
    from tvmsched.runtime import Runtime, load
    from tvmsched.runtime.executor import from_engine, to_engine
    from tvmsched.runtime.preemption import WAIT_SPIN_US

    heap = [{"id": i, "tags": [i]} for i in range(spec["live"] // 2)]  # two tracked objects each
    collections_seen: list[list] = []  # [generation, start, end]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            collections_seen.append([info["generation"], time.perf_counter(), None])
        elif collections_seen:
            collections_seen[-1][2] = time.perf_counter()

    options = {}
    if "freeze_gc" in inspect.signature(Runtime).parameters:  # absent before the option existed
        options["freeze_gc"] = spec["freeze_gc"]
    ex = load(spec["artifact"])
    inputs = ex.random_inputs(spec["seed"])
    gc.callbacks.append(on_gc)
    with Runtime("cpu", **options) as rt:
        model = rt.load(spec["artifact"], name="chain")
        frozen = gc.get_freeze_count()
        stream, ids = model.task.stream, list(model.fastest)
        outputs: dict = {}

        def direct():
            outputs["direct"] = ex.run(inputs)

        def engine_only():  # returns the engine request: its timestamps split the time between Python and the engine
            request = stream.submit(to_engine(inputs), ids)
            request.wait(-1.0, WAIT_SPIN_US)
            outputs["engine"] = from_engine(request.outputs())
            return request

        def submit():
            future = rt.submit(model, inputs)
            outputs["submit"] = future.result()
            return future.request

        ways = {"direct": direct, "engine": engine_only, "submit": submit}
        expected = ex.run(inputs)
        for way in ways.values():
            way()
        identical = all(np.array_equal(expected[k], got[k]) for got in outputs.values() for k in expected)
        for way in ways.values():
            for _ in range(spec["warmup"]):
                way()
        log: list = []
        windows: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
        stamps: dict[str, list[tuple[float, float, float]]] = {w: [] for w in WAYS}  # engine µs: queued, started, done
        rss_before, load_before = _rss_mb(), os.getloadavg()[0]
        first_collection = len(collections_seen)
        for r in range(spec["rounds"]):
            for label in (WAYS if r % 2 == 0 else WAYS[::-1]):
                way, out = ways[label], windows[label]
                for _i in range(spec["per_round"]):
                    _client_work(spec["garbage"], spec["keep"], log)
                    start = time.perf_counter()
                    request = way()
                    out.append((start, time.perf_counter()))
                    if request is not None:
                        stamps[label].append((request.submitted_us, request.started_us, request.finished_us))
        rss_after, load_after = _rss_mb(), os.getloadavg()[0]
        stats = rt.stats()["_scheduler"]
    gc.callbacks.remove(on_gc)
    seen = [c for c in collections_seen[first_collection:] if c[2] is not None]
    result = {"scenario": spec["scenario"], "code": spec["code"], "freeze_gc": spec["freeze_gc"], "freeze_option": bool(options),
              "outputs_identical": identical, "rss_mb": [rss_before, rss_after], "loadavg": [load_before, load_after],
              "tracked_objects": len(gc.get_objects()), "frozen_objects": frozen,
              "scheduler_decisions_kept": stats["decisions"], "collections": _collections(seen), "ways": {}}
    del heap, log
    for label, spans in windows.items():
        starts = np.array([s for s, _ in spans])
        ends = np.array([e for _, e in spans])
        inside = [c for c in seen if _inside(c[1], starts, ends)]
        result["ways"][label] = {"us": ((ends - starts) * 1e6).round(2).tolist(), "gc_inside": _collections(inside)}
        if stamps[label]:  # perf_counter and the engine's clock are both CLOCK_MONOTONIC
            queued, _, finished = (np.array(column) for column in zip(*stamps[label]))
            host = (queued - starts * 1e6) + (ends * 1e6 - finished)  # before the queue + after the end
            result["ways"][label]["host_us"] = host.round(2).tolist()
            result["ways"][label]["stream_us"] = (finished - queued).round(2).tolist()  # queued to done, in the engine
    return result


def _inside(t: float, starts: np.ndarray, ends: np.ndarray) -> bool:
    i = int(np.searchsorted(starts, t, side="right")) - 1
    return i >= 0 and t <= ends[i]


def _collections(seen: list[list]) -> dict:
    by_gen = collections.Counter(int(c[0]) for c in seen)
    ms = [(c[2] - c[1]) * 1e3 for c in seen]
    gen2 = [m for c, m in zip(seen, ms) if c[0] == 2]
    return {"count": len(seen), "by_generation": {str(g): by_gen[g] for g in sorted(by_gen)},
            "max_ms": max(ms, default=0.0), "gen2_max_ms": max(gen2, default=0.0), "total_ms": sum(ms)}


def package_copy(commit: str) -> str:
    """The package's Python at `commit`, laid out as installed (pyproject's [tool.scikit-build.wheel.packages]), with
    this checkout's built engine library: a folder to put first on PYTHONPATH."""
    import tempfile
    import tomllib

    root = Path(__file__).resolve().parent.parent
    dest = Path(tempfile.mkdtemp(prefix="tvmsched-code-"))
    atexit.register(shutil.rmtree, dest, True)
    packages = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["scikit-build"]["wheel"]["packages"]
    layout = {package.replace("/", "."): src for package, src in packages.items()}
    tops = sorted({src.split("/")[0] for src in layout.values()})
    archive = subprocess.run(["git", "archive", commit, *tops], cwd=root, capture_output=True, check=True).stdout
    (dest / "src").mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest / "src"), "-f", "-"], input=archive, check=True)
    for package, src in sorted(layout.items(), key=lambda item: item[0].count(".")):
        target = dest / package.replace(".", "/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            (dest / "src" / src).rename(target)
    from tvmsched.runtime import native

    shutil.copytree(native.package_path("lib"), dest / "tvmsched" / "lib", dirs_exist_ok=True)
    return str(dest)


def run_child(spec: dict, pythonpath: str | None = None, timeout: float = 600) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath} if pythonpath else None
    out = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"child {spec['scenario']} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def scenarios(live: int, garbage: int, keep: int, codes: list[tuple[str, str, list[bool]]]) -> list[dict]:
    """Per heap (bare, heap), per code copy, per freeze_gc setting: one spec."""
    heaps = [("bare", 0, 0), (f"heap {live // 1000}k", live, keep)]
    return [{"scenario": name, "code": code, "pythonpath": path, "live": n, "garbage": garbage, "keep": k, "freeze_gc": f}
            for name, n, k in heaps for code, path, freeze in codes for f in freeze]


def run_all(artifact: Path, *, repeats: int, rounds: int, per_round: int, warmup: int, live: int, garbage: int,
            keep: int, codes: list[tuple[str, str, list[bool]]], seed: int = 0) -> dict:
    """Every scenario `repeats` times (alternating order); per scenario the pooled latencies' summary."""
    specs = scenarios(live, garbage, keep, codes)
    runs: list[dict] = []
    for rep in range(repeats):
        for spec in (specs if rep % 2 == 0 else specs[::-1]):
            runs.append(run_child({**spec, "artifact": str(artifact), "rounds": rounds, "per_round": per_round,
                                   "warmup": warmup, "seed": seed}, spec["pythonpath"] or None))
            print(f"  {spec['scenario']} {spec['code']} freeze_gc={spec['freeze_gc']} done", file=sys.stderr, flush=True)
    report = {"machine": _common.machine_info(), "artifact": str(artifact), "repeats": repeats, "rounds": rounds,
              "per_round": per_round, "warmup": warmup, "live": live, "client_garbage": garbage, "client_keep": keep,
              "seed": seed, "codes": [{"name": c, "pythonpath": p} for c, p, _ in codes],
              "env": {k: v for k, v in os.environ.items() if k.startswith(("TVMSCHED_", "TVM_"))},
              "scenarios": []}
    for spec in specs:
        mine = [r for r in runs if (r["scenario"], r["code"], r["freeze_gc"]) == (spec["scenario"], spec["code"], spec["freeze_gc"])]
        entry = {"scenario": spec["scenario"], "code": spec["code"], "freeze_gc": spec["freeze_gc"], "freeze_option": mine[0]["freeze_option"],
                 "outputs_identical": all(r["outputs_identical"] for r in mine),
                 "rss_growth_mb": [round(r["rss_mb"][1] - r["rss_mb"][0], 2) for r in mine],
                 "loadavg": [r["loadavg"] for r in mine], "tracked_objects": [r["tracked_objects"] for r in mine],
                 "frozen_objects": [r["frozen_objects"] for r in mine],
                 "scheduler_decisions_kept": [r["scheduler_decisions_kept"] for r in mine],
                 "collections": [r["collections"] for r in mine], "ways": {}}
        for way in WAYS:
            pooled = _summary(np.concatenate([r["ways"][way]["us"] for r in mine]))
            pooled["per_repeat_p50_us"] = [round(float(np.percentile(r["ways"][way]["us"], 50)), 1) for r in mine]
            pooled["per_repeat_p99_us"] = [round(float(np.percentile(r["ways"][way]["us"], 99)), 1) for r in mine]
            pooled["gc_inside"] = [r["ways"][way]["gc_inside"] for r in mine]
            for part in ("host_us", "stream_us"):
                if part in mine[0]["ways"][way]:
                    pooled[part] = _summary(np.concatenate([r["ways"][way][part] for r in mine]))
            entry["ways"][way] = pooled
        d, s = entry["ways"]["direct"], entry["ways"]["submit"]
        entry["submit_overhead_p50_us"] = s["p50_us"] - d["p50_us"]
        entry["submit_p99_over_p50"] = s["p99_us"] / s["p50_us"]
        report["scenarios"].append(entry)
    return report


def table(report: dict) -> str:
    """Markdown: per scenario, each path's p50 / p99 and the collections inside its requests."""
    env = " ".join(f"{k}={v}" for k, v in report.get("env", {}).items()) or "none"
    lines = [_common.machine_line(report["machine"]), f"Engine settings from the environment: {env}.", "",
             "| scenario | code | freeze_gc | direct p50 / p99 µs | engine p50 / p99 µs | submit p50 / p99 µs | submit − direct p50 µs "
             "| submit − engine p50 µs | submit p99/p50 | submit outside the stream p50 / p99 µs | submit in the stream p50 / p99 µs | gc inside submit: all (gen 2), longest ms | gc inside direct "
             "| gen-2 collections in the run (longest ms) | RSS growth MB |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|"]
    for e in report["scenarios"]:
        w = e["ways"]
        cell = lambda k: f"{w[k]['p50_us']:.1f} / {w[k]['p99_us']:.1f}"

        def gc_cell(k: str) -> str:
            inside = w[k]["gc_inside"]
            count = sum(g["count"] for g in inside)
            gen2 = sum(g["by_generation"].get("2", 0) for g in inside)
            return f"{count} ({gen2}; {max(g['max_ms'] for g in inside):.1f})"

        part = lambda k: f"{w['submit'][k]['p50_us']:.1f} / {w['submit'][k]['p99_us']:.1f}"
        freeze = ("on" if e["freeze_gc"] else "off") if e["freeze_option"] else "(no option)"
        lines.append(f"| {e['scenario']} | {e['code']} | {freeze} | {cell('direct')} | {cell('engine')} | {cell('submit')} "
                     f"| {e['submit_overhead_p50_us']:.1f} | {w['submit']['p50_us'] - w['engine']['p50_us']:.1f} "
                     f"| {e['submit_p99_over_p50']:.2f} | {part('host_us')} | {part('stream_us')} "
                     f"| {gc_cell('submit')} | {gc_cell('direct')} "
                     f"| {sum(c['by_generation'].get('2', 0) for c in e['collections'])} "
                     f"({max(c['gen2_max_ms'] for c in e['collections']):.0f}) | {max(e['rss_growth_mb']):.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="raw JSON to write")
    parser.add_argument("--label", default="", help="a name for this run (before / after), kept in the JSON")
    parser.add_argument("--artifact-dir", type=Path, default=Path("out/bench-host"))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--per-round", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--live", type=int, default=250_000, help="tracked objects allocated before loading")
    parser.add_argument("--client-garbage", type=int, default=40, help="cyclic garbage objects per request")
    parser.add_argument("--client-keep", type=int, default=16, help="objects the client keeps per request (heap)")
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR:FREEZE",
                        help="a copy of the package and its freeze_gc settings (default: this checkout, off,on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    artifact = chain_artifact(args.artifact_dir)
    codes = []
    for text in args.code or ["current=:off,on"]:
        name, _, rest = text.partition("=")
        path, _, freeze = rest.rpartition(":")
        if path.startswith("git:"):
            path = package_copy(path[4:])
        codes.append((name, path, [{"off": False, "on": True}[f] for f in freeze.split(",")]))
    report = run_all(artifact, repeats=args.repeats, rounds=args.rounds, per_round=args.per_round, warmup=args.warmup,
                     live=args.live, garbage=args.client_garbage, keep=args.client_keep, codes=codes, seed=args.seed)
    report["label"] = args.label
    report["command"] = " ".join(["python", *sys.argv])
    if args.out:
        _common.write_json_atomic(args.out, report)
    print(table(report))


if __name__ == "__main__":
    main()
