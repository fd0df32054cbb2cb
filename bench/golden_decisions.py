"""Golden decisions of the scheduling policies: what the C++ port of runtime/policies/ must reproduce exactly (issue 38,
step 2; the format: tests/data/golden/README.md; the check: tests/runtime/test_policy_golden.py).

    .venv/bin/python bench/golden_decisions.py    # ~3 min on 2 cores (+ ~3 min the first time: kits, compiles)

1. Decisions. bench/colocation.py's kind of mix (several models with Poisson arrivals on one Runtime("cpu")) under
   each policy: colocation with a colocation table of measured pairs (`colocation_rows`: synthetic but plausible
   `profile-coloc` rows of the mix's models), colocation on the fallback rule alone, fastest, partition and fcfs.
   The Runtime's policy is wrapped (`Recorder`): every choose() is recorded with its whole input (the request's
   model, stream and loaded models, the monitor snapshot the policy read: each busy stream's remaining
   CandidateInfo list, a partly done layer with its scaled latency) and its output (the candidate IDs; colocation's
   decision: estimate, meets_qos, other streams). Mixes:
     mix3  mlp, resnet18-small, mobilenetv2: every layer with a 2-thread and a 1-thread candidate (a kit of 2 samples
           measured at 1 and 2 threads, as tests/runtime/test_runtime.py builds them), progress counters on;
     mix2  resnet18-small (the same artifact, on 2 streams) and bert-tiny compiled without candidates (one per layer).
   Every run is then replayed offline, in order, through fresh policy objects (`replay`) and written only if each
   decision comes out identical: tests/data/golden/decisions_<mix>.json.gz.
2. Priority sequences. Operations on real engine streams of a small model (`chain_model`): best-effort streams
   added to and removed from the priority policy, real-time requests held, streams paused and resumed by someone
   else, requests finishing, finish_started_of; and what the engine's preemption group did after each
   (`PriorityHarness`): tests/data/golden/priority_sequences.json.gz. Hand-written scenarios, then seeded random
   ones; every sequence is played twice and kept only if both plays observe the same.

Compiled artifacts and kits are kept in --work (default build/golden) and reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import platform
import random
import sys
import time
from pathlib import Path


from tvmsched.runtime import policies
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "golden"
FORMAT = "tvmsched-golden-decisions/1"
PRIORITY_FORMAT = "tvmsched-golden-priority/1"
COMMAND = ".venv/bin/python bench/golden_decisions.py"

# model, QoS target (ms), streams, compiled with candidates
MIXES = {
    "mix3": {"models": [("mlp", 0.1, 1, True), ("resnet18-small", 5.0, 1, True), ("mobilenetv2", 30.0, 1, True)],
             "rate": 100.0, "seconds": 12.0},
    "mix2": {"models": [("resnet18-small", 4.0, 2, True), ("bert-tiny", 40.0, 1, False)],
             "rate": 120.0, "seconds": 12.0},
}
# runs per mix: (run name, policy, colocation table: "measured" | "fallback" | None)
RUNS = [("colocation", "colocation", "measured"), ("colocation-noprofile", "colocation", "fallback"),
        ("fastest", "fastest", None), ("partition", "partition", None), ("fcfs", "fcfs", None)]


# ------------------------------------------------------------------------------------------------ artifacts


def candidates_artifact(work: Path, name: str) -> Path:
    """`name` with a 2-thread and a 1-thread candidate per layer (a kit of 2 samples measured at 1 and 2 threads)
    and progress counters: the monitor then sees partly done layers."""
    path = work / f"{name}-candidates.tvms"
    if not path.is_file():
        from tvmsched import models
        from tvmsched.pipeline import compile_model
        from tvmsched.tune.kit_build import build_kit, import_results
        from tvmsched.tune.kit_run import measure_kit

        kit, db = work / f"{name}-kit", f"sqlite:///{work / name}-kit.db"
        if not (work / f"{name}-kit.db").is_file():
            build_kit(models.build(name), kit, target="llvm", samples=2, progress=False)
            import_results(kit, measure_kit(kit, [1, 2], repeat=2, progress=False), db)
        artifact = compile_model(models.build(name), name=name, qos_ms=1000.0, database=db, progress_counters=True)
        artifact.save(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


def plain_artifact(work: Path, name: str) -> Path:
    """`name` with the default schedules: one candidate per layer."""
    path = work / f"{name}.tvms"
    if not path.is_file():
        from tvmsched import models
        from tvmsched.pipeline import compile_model

        compile_model(models.build(name), name=name).save(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


def chain_model():
    """The priority sequences' model: six 16x256 @ 256x256 MatMul+Relu layers (seeded weights; ~0.5-2 ms a request on
    2 cores), slow enough for the harness to pause a request between its layers, quick to compile (~1 s)."""
    from tvmsched.models.common import GraphBuilder, make_model

    g, x = GraphBuilder(0), "x"
    for i in range(6):
        x = g.op("MatMul", [x, g.normal(f"w{i}", [256, 256], 256 ** -0.5)], f"mm{i}")
        x = g.op("Relu", [x], "y" if i == 5 else f"relu{i}")
    return make_model(g, "chain", {"x": [16, 256]}, {"y": [16, 256]})


def chain_artifact(work: Path) -> Path:
    path = work / "chain.tvms"
    if not path.is_file():
        from tvmsched.pipeline import compile_model

        compile_model(chain_model(), name="chain").save(path.with_suffix(".tmp"))
        path.with_suffix(".tmp").rename(path)
    return path


def colocation_rows(paths: list[Path], total_units: int, seed: int) -> list[dict]:
    """Synthetic but plausible `tvmsched profile-coloc` rows for the mix's distinct models: every candidate of each
    model's heaviest layer beside every candidate of the other's, both ways (what profile-coloc measures), with an
    interference per unit time r of the units' oversubscription plus 0.02-0.3 (shared caches and memory bandwidth),
    below 0.95. (A real profile on this shared 2-core VM measured r = 0 for most pairs: noise, not interference.)"""
    from tvmsched.artifact.format import Artifact

    rng = random.Random(seed)
    heaviest = []
    for path in dict.fromkeys(paths):
        manifest = Artifact.load(path).manifest
        layer = max(manifest.layers, key=lambda l: l.candidates[0].latency_us or l.flops)
        heaviest.append([(f"{manifest.model_name}/{c.kernel}", min(c.units or total_units, total_units), c.latency_us)
                         for c in layer.candidates])
    rows = []
    for i in range(len(heaviest)):
        for j in range(i + 1, len(heaviest)):
            for a in heaviest[i]:
                for b in heaviest[j]:
                    for first, second in ((a, b), (b, a)):
                        demand = first[1] + second[1]
                        r = min(0.95, max(0.0, (demand - total_units) / demand) + rng.uniform(0.02, 0.3))
                        rows.append({"first": first[0], "second": second[0], "isolated_us": first[2],
                                     "colocated_us": first[2] and first[2] / (1 - r), "overhead_per_unit_time": r})
    return rows


# ------------------------------------------------------------------------------------------------ recording


class Recorder:
    """Wraps a Runtime's policy: each choose() is kept with the request, the monitor snapshot the policy read (None:
    not read) and what it decided (ids; colocation's Decision, None when it took none)."""

    def __init__(self, policy: policies.Policy):
        self.policy = policy
        self.records: list[tuple] = []

    def __getattr__(self, name):  # serial, kind, scheduler: the wrapped policy's
        return getattr(self.policy, name)

    def choose(self, request: policies.Request) -> list[int]:
        seen = []

        def monitor():
            views = request.monitor()
            seen.append(list(views.items()))  # before the policy takes its own stream out
            return views

        scheduler = getattr(self.policy, "scheduler", None)
        decided = scheduler.decided if scheduler is not None else 0
        ids = self.policy.choose(dataclasses.replace(request, monitor=monitor))
        decision = scheduler.decisions[-1] if scheduler is not None and scheduler.decided > decided else None
        if len(seen) > 1:
            raise AssertionError("the policy read the monitor twice")
        self.records.append((request, seen[0] if seen else None, list(ids), decision))
        return ids


def record_run(paths: dict[str, Path], mix: dict, policy: str, table: ColocationTable | None, seed: int) -> dict:
    """One mix under one policy: load, warm up (one request each), Poisson arrivals; every decision recorded."""
    from reference_runtime import ReferenceRuntime  # the Python policies deciding at submit, as they were recorded

    rt = ReferenceRuntime("cpu", policy=policy, colocation=table)
    recorder = Recorder(rt.policy)
    rt.policy = recorder
    handles = [rt.load(paths[name], qos_ms=qos, streams=streams) for name, qos, streams, _ in mix["models"]]
    inputs = [h.task.executor.random_inputs(i) for i, h in enumerate(handles)]
    for handle, x in zip(handles, inputs):  # warm-up (recorded: the policies' state starts here)
        rt.submit(handle, x).result()
    from colocation import drive, poisson_arrivals  # bench/colocation.py: the same arrivals and driving

    drive(rt, handles, inputs, poisson_arrivals(len(handles), mix["rate"], mix["seconds"], seed))
    stats = rt.stats()
    real_table = getattr(recorder.policy, "scheduler", None)
    rt.shutdown()
    models = {h.name: h for h in handles}
    return {"records": recorder.records, "models": models, "total_units": rt.total_units,
            "table": real_table.table if real_table is not None else None,
            "violations": {name: stats[name]["qos_violations"] for name in models}}


# ------------------------------------------------------------------------------------------------ encoding


def encode_model(model) -> dict:
    """A model's candidates once (flat, deduplicated), its layers as indices into them."""
    flat: list[CandidateInfo] = []
    index: dict[CandidateInfo, int] = {}
    layers = []
    for cands in model.layers:
        row = []
        for cand in cands:
            if cand not in index:
                index[cand] = len(flat)
                flat.append(cand)
            row.append(index[cand])
        layers.append(row)
    return {"qos_ms": model.qos_ms, "streams": [t.name for t in model.tasks],
            "candidates": [[c.units, float(c.latency_us), c.key] for c in flat], "layers": layers,
            "fastest": list(model.fastest), "choice": any(len(c) > 1 for c in model.layers)}


def encode_remaining(remaining: tuple[CandidateInfo, ...], model: dict) -> list:
    """A stream's remaining work as candidate indices of its model; a partly done layer as [index, scaled latency]."""
    by_key = {c[2]: i for i, c in reversed(list(enumerate(model["candidates"])))}
    out = []
    for cand in remaining:
        i = by_key[cand.key]
        stored = model["candidates"][i]
        if stored[0] != cand.units:
            raise AssertionError(f"{cand.key}: units {cand.units} in the monitor, {stored[0]} in the model")
        out.append(i if stored[1] == cand.latency_us else [i, float(cand.latency_us)])
    return out


def encode_run(name: str, policy: str, table_kind: str | None, recorded: dict, encoded_models: dict, rate: float,
               seconds: float, seed: int) -> dict:
    stream_model = {s: m for m, enc in encoded_models.items() for s in enc["streams"]}
    snapshots = []
    for request, seen, ids, decision in recorded["records"]:
        if request.total_units != recorded["total_units"]:
            raise AssertionError("total_units changed within a run")
        snap = {"model": request.model, "stream": request.own_stream, "loaded_models": request.loaded_models,
                "monitor": None if seen is None else [
                    [stream, encode_remaining(view.remaining, encoded_models[stream_model[stream]])]
                    for stream, view in seen],
                "ids": ids}
        if seen is not None and decode_monitor(snap["monitor"], encoded_models, stream_model) != dict(seen):
            raise AssertionError("a monitor snapshot does not decode to what the policy read")
        if decision is not None:
            if list(decision.candidate_ids) != ids or decision.model != request.model:
                raise AssertionError("the scheduler's decision is not what the policy returned")
            snap.update(estimated_ms=float(decision.estimated_ms), meets_qos=bool(decision.meets_qos),
                        streams=int(decision.streams))
        snapshots.append(snap)
    table = recorded["table"]
    return {"name": name, "policy": policy, "table_kind": table_kind, "total_units": recorded["total_units"],
            "table": None if table is None else {
                "total_units": table.total_units,
                "measured": [[a, b, float(r)] for (a, b), r in table.measured.items()],
                "units_of": [[k, u] for k, u in table.units_of.items()]},
            "models": list(recorded["models"]), "stream_model": stream_model,
            "arrivals": {"rate_per_s": rate, "seconds": seconds, "seed": seed},
            "qos_violations": recorded["violations"], "snapshots": snapshots}


# ------------------------------------------------------------------------------------------------ replay


def decode_model(model: dict) -> list[list[CandidateInfo]]:
    cands = [CandidateInfo(int(u), float(lat), str(key)) for u, lat, key in model["candidates"]]
    return [[cands[i] for i in row] for row in model["layers"]]


def decode_monitor(monitor: list, models: dict, stream_model: dict) -> dict[str, StreamView]:
    views = {}
    for stream, entries in monitor:
        cands = models[stream_model[stream]]["candidates"]
        remaining = []
        for entry in entries:
            i, latency = (entry, None) if isinstance(entry, int) else entry
            units, lat, key = cands[i]
            remaining.append(CandidateInfo(int(units), float(lat if latency is None else latency), str(key)))
        views[stream] = StreamView(stream, tuple(remaining))
    return views


def make_policy(run: dict) -> policies.Policy:
    table = run["table"]
    if run["policy"] != "colocation":
        return policies.create(run["policy"], total_units=run["total_units"])
    return policies.create("colocation", total_units=run["total_units"], table=ColocationTable(
        int(table["total_units"]), {(a, b): float(r) for a, b, r in table["measured"]},
        {k: int(u) for k, u in table["units_of"]}))


def replay(doc: dict):
    """Replay every run of a decisions file, in order, through fresh policy objects (their state, such as colocation's
    per-model estimate of the fastest candidates and partition's choices, builds up as it did while recording).
    Yields (run name, snapshot index, snapshot, replayed: dict with ids and, where a decision was taken, estimated_ms,
    meets_qos, streams; monitor_read)."""
    for run in doc["runs"]:
        policy = make_policy(run)
        layers = {name: decode_model(doc["models"][name]) for name in run["models"]}
        for index, snap in enumerate(run["snapshots"]):
            model = doc["models"][snap["model"]]
            reads = []

            def monitor(snap=snap, reads=reads):
                reads.append(1)
                if snap["monitor"] is None:
                    return {}
                return decode_monitor(snap["monitor"], doc["models"], run["stream_model"])

            request = policies.Request(snap["model"], layers[snap["model"]], model["qos_ms"], monitor,
                                       run["total_units"], snap["loaded_models"], tuple(model["fastest"]),
                                       choice=model["choice"], stream=snap["stream"])
            scheduler = getattr(policy, "scheduler", None)
            decided = scheduler.decided if scheduler is not None else 0
            ids = policy.choose(request)
            out = {"ids": list(ids), "monitor_read": bool(reads)}
            if scheduler is not None and scheduler.decided > decided:
                decision = scheduler.decisions[-1]
                out.update(estimated_ms=decision.estimated_ms, meets_qos=decision.meets_qos, streams=decision.streams)
            yield run["name"], index, snap, out


def mismatches(doc: dict) -> list[str]:
    """Snapshots whose replay differs from the recorded decision (exact float equality), as lines."""
    bad = []
    for name, index, snap, out in replay(doc):
        want = {k: snap[k] for k in ("ids", "estimated_ms", "meets_qos", "streams") if k in snap}
        got = {k: out[k] for k in ("ids", "estimated_ms", "meets_qos", "streams") if k in out}
        if got != want or out["monitor_read"] != (snap["monitor"] is not None):
            bad.append(f"{name} #{index}: recorded {want} (monitor read: {snap['monitor'] is not None}), "
                       f"replayed {got} (monitor read: {out['monitor_read']})")
    return bad


def independent_mismatches(doc: dict) -> int:
    """Snapshots whose decision differs when each is replayed alone (a fresh policy per snapshot): how much the
    decisions depend on the policies' state."""
    count = 0
    for run in doc["runs"]:
        for snap in run["snapshots"]:
            alone = dict(doc, runs=[dict(run, snapshots=[snap])])
            count += bool(mismatches(alone))
    return count


def record_decisions(work: Path, out: Path, seconds: float | None, mixes: list[str]) -> dict:
    """Record every mix under every policy, replay it, write decisions_<mix>.json.gz; a summary per mix."""
    from tvmsched.runtime import native
    from tvmsched.runtime.colocation import table_from_rows

    total = int(native.device_info("cpu")["total_units"])
    summary = {}
    for mix_name in mixes:
        mix = dict(MIXES[mix_name])
        if seconds is not None:
            mix["seconds"] = seconds
        paths = {name: candidates_artifact(work, name) if cands else plain_artifact(work, name)
                 for name, _, _, cands in mix["models"]}
        rows = colocation_rows(list(paths.values()), total, seed=list(MIXES).index(mix_name))
        doc = {"format": FORMAT, "command": COMMAND, "mix": mix_name,
               "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}", "models": {}, "runs": []}
        for run_index, (run_name, policy, table_kind) in enumerate(RUNS):
            table = {"measured": lambda: table_from_rows(rows, total), "fallback": lambda: ColocationTable(total),
                     None: lambda: None}[table_kind]()  # a fresh table per run (loading fills its units_of)
            seed = 100 * (list(MIXES).index(mix_name) + 1) + run_index
            started = time.perf_counter()
            recorded = record_run(paths, mix, policy, table, seed)
            for name, model in recorded["models"].items():
                enc = encode_model(model)
                if doc["models"].setdefault(name, enc) != enc:
                    raise AssertionError(f"model {name} differs between runs")
            run = encode_run(f"{mix_name}/{run_name}", policy, table_kind, recorded, doc["models"], mix["rate"],
                             mix["seconds"], seed)
            doc["runs"].append(run)
            print(f"{run['name']}: {len(run['snapshots'])} snapshots, "
                  f"{count_snapshots(run)['other_stream_busy']} with another stream busy, "
                  f"QoS violations {run['qos_violations']} ({time.perf_counter() - started:.1f} s)", flush=True)
        doc = json.loads(json.dumps(doc, allow_nan=False))  # as a reader sees it (floats: repr, exact)
        bad = mismatches(doc)
        if bad:
            raise SystemExit("replay differs from the recorded decisions:\n" + "\n".join(bad[:20]))
        path = out / f"decisions_{mix_name}.json.gz"
        write_gzip(path, doc)
        summary[mix_name] = {"file": shown(path), "bytes": path.stat().st_size,
                             "differ_when_replayed_alone": independent_mismatches(doc),
                             "runs": {r["name"]: count_snapshots(r) for r in doc["runs"]}}
        print(json.dumps(summary[mix_name]), flush=True)
    return summary


def count_snapshots(run: dict) -> dict:
    """Snapshots; with the monitor read; with another stream busy (colocation's greedy path); decisions taken; at
    risk (meets_qos false); partly done layers in the monitors."""
    snaps = run["snapshots"]
    others = [s for s in snaps if s["monitor"] and any(e for stream, e in s["monitor"] if stream != s["stream"])]
    return {"snapshots": len(snaps), "monitor_read": sum(s["monitor"] is not None for s in snaps),
            "other_stream_busy": len(others), "decisions": sum("estimated_ms" in s for s in snaps),
            "at_risk": sum(s.get("meets_qos") is False for s in snaps),
            "partial_layers": sum(isinstance(e, list) for s in snaps for _, es in (s["monitor"] or []) for e in es)}


def shown(path: Path) -> str:
    """The path relative to the repository when it is inside it."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def write_gzip(path: Path, doc: dict) -> None:
    """Compact JSON, gzip without a timestamp (the same document gives the same bytes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as out:
        out.write(data)


def read_gzip(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------ priority policy


class PriorityHarness:
    """Real engine streams of one model driven through the priority policy (runtime/policies/priority.py) and
    someone else's pauses; after each operation it waits until every stream that is not paused is idle, then
    observes. Stream names: be0.. (best-effort tasks), rt0.. (real-time tasks); each has its own engine model.

    Operations ({"op": ..., "stream": name} unless said):
      add / remove       Priorities.add_best_effort / remove_best_effort of the stream
      pause / resume     the stream paused / resumed by someone else (Task.preempt(), Task.resume())
      submit (n)         n plain requests queued on the stream (Task.submit)
      start              the stream (idle) gets one request that has started (a layer done, or a launch aborted to
                         run again) and is paused by someone else before its end: submit, resume, pause once its
                         progress shows a layer done; again until it is paused so
      hold               a real-time request on the stream (Priorities.submit_realtime); it runs at once unless the
                         stream is paused
      finish_started_of  {"streams": [...]}: Priorities.memory_blocked with those streams' models as the holders;
                         the observation's "result" is how many streams finished their started request for it
    Observation after each: per stream (in `names` order) paused (0/1), pending (requests queued or running) and
    preempted (times the group paused it: the stream's preemption count less the pauses someone else made), the
    group's preempted() and active(), and "result" (finish_started_of). Counts are from the sequence's start; every
    sequence starts with a fresh Priorities and every stream idle, running and in no group.
    """

    def __init__(self, artifact, best_effort: int = 3, realtime: int = 3):
        from tvmsched.runtime import Executor
        from tvmsched.runtime.preemption import Task

        self.names = [f"be{i}" for i in range(best_effort)] + [f"rt{i}" for i in range(realtime)]  # the file's order
        self.tasks = {name: Task(Executor(artifact), name) for name in self.names}
        self.inputs = self.tasks[self.names[0]].executor.random_inputs(0)
        self.priorities = None

    def close(self) -> None:
        for task in self.tasks.values():
            task.resume()
            task.close()

    def begin(self) -> None:
        from tvmsched.runtime.policies.priority import Priorities

        self.priorities = Priorities()
        self.members: set[str] = set()
        self.base = {name: task.preemptions for name, task in self.tasks.items()}
        self.outside = dict.fromkeys(self.names, 0)  # pauses someone else (the harness) made
        self.futures: dict[str, list] = {name: [] for name in self.names}

    def end(self) -> None:
        for name in list(self.members):
            self.priorities.remove_best_effort(self.tasks[name])
        for task in self.tasks.values():
            task.resume()
        self.settle()
        for future in [f for futures in self.futures.values() for f in futures]:
            future.result(timeout=60)
        self.priorities = None

    def _pause(self, name: str):
        task = self.tasks[name]
        before = task.preemptions
        report = task.preempt()
        self.outside[name] += task.preemptions - before
        return report

    def apply(self, op: dict, rng: random.Random) -> int | None:
        kind, name = op["op"], op.get("stream")
        task = self.tasks.get(name)
        if kind == "add":
            self.priorities.add_best_effort(task)
            self.members.add(name)
        elif kind == "remove":
            self.priorities.remove_best_effort(task)
            self.members.discard(name)
        elif kind == "pause":
            self._pause(name)
        elif kind == "resume":
            task.resume()
        elif kind == "submit":
            self.futures[name] += [task.submit(self.inputs) for _ in range(op["n"])]
        elif kind == "start":
            self._start(name, rng)
        elif kind == "hold":
            self.futures[name].append(self.priorities.submit_realtime(task, self.inputs))
        elif kind == "finish_started_of":
            before = self.priorities.finished_for_memory
            self.priorities.memory_blocked(None, [self.tasks[n].executor.native for n in op["streams"]])
            return self.priorities.finished_for_memory - before
        else:
            raise ValueError(f"unknown operation {kind!r}")
        return None

    def _start(self, name: str, rng: random.Random) -> None:
        task = self.tasks[name]
        if task.pending:
            raise AssertionError(f"start: {name} is not idle")
        for _ in range(1000):
            if task.pending == 0:
                self.futures[name].append(task.submit(self.inputs))
            task.resume()
            deadline = time.monotonic() + 1.0
            while task.pending and time.monotonic() < deadline:  # until a layer is done (or the request is)
                time.sleep(rng.uniform(0, 2e-4))  # (sleeping: a busy poll can keep the stream's thread off the CPU)
                state = task.state()
                if state is not None and (state.done > 0).any():
                    break
            aborted = self._pause(name).rerun  # a launch it stopped, to run again on resume
            state = task.state()
            if task.pending == 1 and state is not None and ((state.done > 0).any() or aborted):
                return
        raise AssertionError(f"start: {name} never paused mid-request")

    def settle(self, timeout_s: float = 60.0) -> None:
        """Until every stream is paused or idle with its requests' results out (what runs ends; a paused stream never
        moves; a real-time request releases the group before its result can be seen, not before its stream is idle)."""
        deadline = time.monotonic() + timeout_s
        while any(not t.paused and (t.pending or not all(f.done() for f in self.futures[n]))
                  for n, t in self.tasks.items()):
            if time.monotonic() > deadline:
                raise AssertionError("streams did not settle")
            time.sleep(0.0005)

    def observe(self, result: int | None) -> dict:
        tasks = [self.tasks[n] for n in self.names]
        seen = {"paused": [int(t.paused) for t in tasks], "pending": [t.pending for t in tasks],
                "preempted": [t.preemptions - self.base[n] - self.outside[n] for n, t in zip(self.names, tasks)],
                "group": [self.priorities.preempted, self.priorities.realtime_active]}
        if result is not None:
            seen["result"] = result
        return seen

    def play(self, ops: list[dict], seed: int, expected: list[dict] | None = None, wait_s: float = 10.0) -> list[dict]:
        """Apply `ops` from a fresh start; the observation after each. With `expected`, after each op it waits (up to
        `wait_s`) for the observation to equal the expected one (the CPU's asynchronous mode resumes a stream once its
        own thread has drained) and stops at the first that never does."""
        rng = random.Random(seed)
        self.begin()
        seen = []
        try:
            for index, op in enumerate(ops):
                result = self.apply(op, rng)
                self.settle()
                now = self.observe(result)
                if expected is not None:
                    deadline = time.monotonic() + wait_s
                    while now != expected[index] and time.monotonic() < deadline:
                        time.sleep(0.001)
                        self.settle()
                        now = self.observe(result)
                seen.append(now)
                if expected is not None and now != expected[index]:
                    break
        finally:
            self.end()
        return seen

    def random_ops(self, seed: int, length: int) -> list[dict]:
        """A random valid sequence, chosen against what is true of the streams while it is built (played at once)."""
        rng, timing = random.Random(seed), random.Random(seed + 1)
        ops = []
        self.begin()
        try:
            for _ in range(length):
                be = [n for n in self.names if n.startswith("be")]
                choices = [{"op": "add", "stream": n} for n in be if n not in self.members]
                choices += [{"op": "remove", "stream": n} for n in be if n in self.members]
                choices += [{"op": "pause", "stream": n} for n in self.names if not self.tasks[n].paused]
                choices += [{"op": "resume", "stream": n} for n in self.names if self.tasks[n].paused] * 2
                choices += [{"op": "submit", "stream": n, "n": rng.randint(1, 3)} for n in self.names]
                choices += [{"op": "start", "stream": n} for n in be if not self.tasks[n].pending] * 2
                choices += [{"op": "hold", "stream": n} for n in self.names] * 2
                choices += [{"op": "finish_started_of", "streams": sorted(rng.sample(self.names, rng.randint(1, 3)))}
                            for _ in range(3)]
                op = rng.choice(choices)
                ops.append(op)
                self.apply(op, timing)
                self.settle()
        finally:
            self.end()
        return ops


def _ops(*items) -> list[dict]:
    """("add", "be0"), ("submit", "be0", 2), ("finish_started_of", ["be0"]) -> operation dicts."""
    out = []
    for item in items:
        kind, rest = item[0], item[1:]
        if kind == "finish_started_of":
            out.append({"op": kind, "streams": list(rest[0])})
        elif kind == "submit":
            out.append({"op": kind, "stream": rest[0], "n": rest[1]})
        else:
            out.append({"op": kind, "stream": rest[0]})
    return out


SCENARIOS = {
    "first_hold_preempts_busy_and_idle_members_last_release_resumes_them": _ops(
        ("add", "be0"), ("add", "be1"), ("pause", "be0"), ("submit", "be0", 2), ("pause", "rt0"), ("hold", "rt0"),
        ("hold", "rt0"), ("submit", "be1", 1), ("resume", "rt0"), ("hold", "rt1"), ("submit", "be0", 1)),
    "nested_holds_on_two_streams_release_when_the_last_finishes": _ops(
        ("add", "be0"), ("pause", "rt0"), ("pause", "rt1"), ("hold", "rt0"), ("hold", "rt1"), ("submit", "be0", 1),
        ("resume", "rt0"), ("resume", "rt1"), ("hold", "rt0")),
    "a_member_added_while_held_is_paused_at_once_a_removed_one_resumes": _ops(
        ("pause", "rt0"), ("hold", "rt0"), ("add", "be0"), ("pause", "be1"), ("submit", "be1", 2), ("add", "be1"),
        ("remove", "be0"), ("submit", "be0", 1), ("remove", "be1"), ("add", "be2"), ("resume", "rt0"),
        ("remove", "be2"), ("hold", "rt0")),
    "a_best_effort_models_own_real_time_request_leaves_its_stream_alone": _ops(
        ("add", "be0"), ("add", "be1"), ("pause", "be0"), ("hold", "be0"), ("submit", "be1", 1), ("resume", "be0"),
        ("hold", "be1"), ("add", "be2"), ("pause", "be2"), ("hold", "be2"), ("resume", "be2")),
    "finish_started_of_runs_started_requests_of_held_members_to_their_end": _ops(
        ("add", "be0"), ("add", "be1"), ("add", "be2"), ("start", "be0"), ("pause", "be1"), ("submit", "be1", 1),
        ("start", "be2"), ("submit", "be2", 1), ("pause", "rt0"), ("hold", "rt0"),
        ("finish_started_of", ["be0", "be1", "rt0"]), ("finish_started_of", ["be0"]),
        ("finish_started_of", ["be2"]), ("finish_started_of", ["be2"]), ("resume", "rt0")),
    "finish_started_of_does_nothing_when_not_held_or_not_a_member": _ops(
        ("add", "be0"), ("start", "be0"), ("finish_started_of", ["be0"]), ("start", "be1"), ("pause", "rt0"),
        ("hold", "rt0"), ("finish_started_of", ["be1"]), ("resume", "be1"), ("resume", "rt0"), ("resume", "be0")),
    "a_removed_paused_member_with_queued_work_resumes_while_held": _ops(
        ("add", "be0"), ("add", "be1"), ("pause", "rt0"), ("hold", "rt0"), ("submit", "be0", 3), ("start", "be1"),
        ("remove", "be0"), ("remove", "be1"), ("add", "be1"), ("resume", "rt0"), ("resume", "be1")),
}
RANDOM_SEQUENCES, RANDOM_LENGTH = 16, 30


def record_priority(work: Path, out: Path) -> dict:
    harness = PriorityHarness(chain_artifact(work))
    sequences = []
    try:
        named = list(SCENARIOS.items())
        named += [(f"random_{seed}", harness.random_ops(seed, RANDOM_LENGTH)) for seed in range(RANDOM_SEQUENCES)]
        for index, (name, ops) in enumerate(named):
            first = harness.play(ops, seed=index)
            second = harness.play(ops, seed=index + 1000)  # another timing of the start operation's retries
            if first != second:
                raise SystemExit(f"priority sequence {name}: two plays observed different things:\n{first}\n{second}")
            steps = [dict(op, after=seen) for op, seen in zip(ops, first)]
            sequences.append({"name": name, "seed": index, "steps": steps})
    finally:
        harness.close()
    doc = {"format": PRIORITY_FORMAT, "command": COMMAND, "model": "chain (bench/golden_decisions.py chain_model(), "
           "default schedules)",
           "streams": harness.names, "sequences": sequences}
    path = out / "priority_sequences.json.gz"
    write_gzip(path, doc)
    steps = [s for seq in sequences for s in seq["steps"]]
    summary = {"file": shown(path), "bytes": path.stat().st_size, "sequences": len(sequences),
               "steps": len(steps),
               "ops": {k: sum(s["op"] == k for s in steps) for k in sorted({s["op"] for s in steps})},
               "group_preempted_total": sum(seq["steps"][-1]["after"]["group"][0] for seq in sequences),
               "finished_for_memory": sum(s["after"].get("result", 0) for s in steps)}
    print(json.dumps(summary), flush=True)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "golden",
                        help="compiled artifacts and kits (reused)")
    parser.add_argument("--seconds", type=float, help="seconds of arrivals per run (default: each mix's)")
    parser.add_argument("--mixes", nargs="+", default=list(MIXES), choices=list(MIXES))
    parser.add_argument("--parts", nargs="+", default=["decisions", "priority"], choices=["decisions", "priority"])
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    summary = {}
    if "decisions" in args.parts:
        summary["decisions"] = record_decisions(args.work, args.out, args.seconds, args.mixes)
    if "priority" in args.parts:
        summary["priority"] = record_priority(args.work, args.out)
    json.dump(summary, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
