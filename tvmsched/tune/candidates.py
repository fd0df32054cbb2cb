"""Stage 4b: restricted-unit candidates with per-layer QoS bounds (the FineCo offline method).

1. each layer's best full-unit implementation comes from `tuning.tune_layers`;
2. it is measured at fewer units;
3. layer QoS bound = model QoS target x the layer's share of the model's full-unit time;
4. unit counts whose latency exceeds the bound are dropped;
5. the layer is re-tuned at each remaining count (measured under that restriction); the faster of
   the re-tuned and the full-unit implementation at that count becomes a candidate.
Candidate IDs: 0 = full units, then by decreasing units.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass, field

from tvmsched.tune import search as tuning
from tvmsched.errors import TvmschedError
from tvmsched.lower.layers import arg_specs as layer_arg_specs
from tvmsched.tune.local_timing import measure_at_units
from tvmsched.lower.targets import describe

GRID_LIMIT_UNIT_KIND = "gpu_sm_grid"  # as tvmsched.tune.kit_build stores grid-limited measurements

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CandidateKernel:
    id: int
    units: int
    blocks: int | None
    latency_us: float
    memory_bytes: int
    schedule: str  # "tuned" (full units), "retuned" (at its units) or the default schedule's name
    func: object = field(repr=False, compare=False)
    mechanism: str = "cpu_threads"


@dataclass(frozen=True)
class LayerCandidates:
    """Everything the method decided for one PrimFunc (shared by the layers that call it)."""

    func: str
    curve_us: dict[int, float]  # latency of the full-unit best at each unit count
    bound_us: float
    kept_units: list[int]
    candidates: list[CandidateKernel]


def cpu_units(target) -> int:
    return int(target.attrs.get("num-cores", 1))


def units_to_try(target, requested: list[int] | None) -> list[int]:
    """The unit counts to measure (default on CPU: 1..cores); errors on counts the target lacks."""
    if not describe(target).cpu:
        raise TvmschedError("restricted-unit tuning on CUDA needs a GPU to measure on (not implemented yet)")
    full = cpu_units(target)
    units = sorted(set(requested or range(1, full + 1)))
    bad = [k for k in units if k < 1 or k > full]
    if bad:
        raise TvmschedError(f"--units {bad} outside 1..{full} (the target's num-cores)")
    return units


def qos_bounds(layer_times_us: list[tuple[str, float]], qos_ms: float) -> dict[str, float]:
    """Per-layer bound = QoS x layer time / model time; a target even full units miss is an error."""
    total = sum(t for _, t in layer_times_us)
    if total > qos_ms * 1e3:
        slowest = sorted(layer_times_us, key=lambda item: -item[1])[:3]
        names = ", ".join(f"{name} ({t / 1e3:.4g} ms)" for name, t in slowest)
        raise TvmschedError(
            f"QoS target {qos_ms} ms is infeasible: with all units the model takes {total / 1e3:.4g} ms; "
            f"slowest layers: {names}"
        )
    return {name: qos_ms * 1e3 * t / total for name, t in layer_times_us}


def kept_units(curve_us: dict[int, float], bound_us: float, full: int) -> list[int]:
    """Step 4: the restricted unit counts (all but `full`) at which the full-unit implementation meets the bound."""
    return [k for k, latency in sorted(curve_us.items()) if k != full and latency <= bound_us]


def plan_candidates(
    graph, funcs: dict, best: dict, target, database, *, qos_ms: float, units: list[int] | None, trials: int,
    progress: bool = False,
) -> dict[str, LayerCandidates]:
    """Run steps 2-5 for every PrimFunc; `best` holds each one's full-unit implementation."""
    units_list, full = units_to_try(target, units), cpu_units(target)
    arg_specs = layer_arg_specs(graph)
    curves = {name: measure_at_units(best[name], target, arg_specs[name], sorted({*units_list, full})) for name in funcs}
    bounds = qos_bounds([(layer.func, curves[layer.func][full]) for layer in graph.layers], qos_ms)
    kept = {name: kept_units(curves[name], bounds[name], full) for name in funcs}
    retuned = {}
    for k in sorted({k for units_kept in kept.values() for k in units_kept}, reverse=True):  # one tuning per unit count
        names = [name for name in funcs if k in kept[name]]
        retuned.update(_retuned(names, funcs, best, curves, k, target, database, trials, arg_specs, graph, progress))
    plans = {}
    for name in funcs:
        full_unit = _candidate(0, full, best[name], curves[name][full], "tuned", graph, name)
        restricted = [retuned[name, k] for k in sorted(kept[name], reverse=True)]
        restricted = [c for c in restricted if c.latency_us <= bounds[name]]
        candidates = [full_unit, *(dataclasses.replace(c, id=i) for i, c in enumerate(restricted, start=1))]
        plans[name] = LayerCandidates(name, curves[name], bounds[name], kept[name], candidates)
        log.info("%s: bound %.1f us, kept units %s, %d candidates", name, bounds[name], kept[name], len(candidates))
    return plans


def plan_from_records(graph, funcs: dict, target, database, *, qos_ms: float, units: list[int] | None) -> dict[str, LayerCandidates]:
    """Steps 2-5 from measured records (a kit measured on the device machine, `tvmsched tune import`).

    Each layer's records at all units give its best implementation (step 1); the records of that
    same schedule at k units give its curve (step 2); the fastest record at k units is the re-tuned
    implementation (step 5), measured under that restriction on the device. No device needed here.
    """
    from tvmsched.tuning_db.store import target_hash
    from tvmsched.tuning_db.ms_adapter import target_to_json

    store = database.store
    t_hash = target_hash(target_to_json(target))
    info = describe(target)
    mechanism = info.mechanism
    full = cpu_units(target) if info.cpu else 0  # the database's records of a GPU at all its SMs: units 0
    measured = {}
    for name, func in funcs.items():
        workload_id = database.workload_id(tuning.task_module(func))
        rows = [] if workload_id is None else store.top_k(workload_id, 1_000_000, target_hash=t_hash)
        by_units: dict[int, list] = {}
        grid_limited: dict[int, list] = {}
        for row in rows:  # fastest first
            (grid_limited if row.unit_kind == GRID_LIMIT_UNIT_KIND else by_units).setdefault(row.units, []).append(row)
        for k, limited in grid_limited.items():  # used where no green-context record exists
            by_units.setdefault(k, limited)
        if full not in by_units:
            raise TvmschedError(
                f"layer {name} has no measured record at all units for {info.kind}: build, measure and import "
                "a kit first (tvmsched tune kit / tune measure / tune import)"
            )
        measured[name] = by_units
    curves = {}
    for name, by_units in measured.items():
        best = by_units[full][0]
        same = {k: _same_schedule(rows, best) for k, rows in by_units.items() if k != full and (units is None or k in units)}
        curve = {k: row.mean_latency_s * 1e6 for k, row in sorted(same.items()) if row is not None}
        curves[name] = {**curve, full: best.mean_latency_s * 1e6}
    bounds = qos_bounds([(layer.func, curves[layer.func][full]) for layer in graph.layers], qos_ms)
    plans = {}
    for name, by_units in measured.items():
        best, full_func = by_units[full][0], _scheduled(funcs[name], by_units[full][0])
        kept = kept_units(curves[name], bounds[name], full)
        candidates = [_candidate(0, full, full_func, curves[name][full], "tuned", graph, name, mechanism)]
        for k in sorted(kept, reverse=True):
            top = by_units[k][0]
            if top.mean_latency_s * 1e6 > bounds[name]:
                continue
            kind = "tuned" if top.trace_json == best.trace_json else "retuned"
            func, how = _scheduled(funcs[name], top), mechanism
            if top.unit_kind == GRID_LIMIT_UNIT_KIND:
                from tvmsched.passes.grid_limit import grid_limit

                func, how = grid_limit(func, k)[0], "grid_limit"
            candidates.append(_candidate(len(candidates), k, func, top.mean_latency_s * 1e6, kind, graph, name, how))
        plans[name] = LayerCandidates(name, curves[name], bounds[name], kept, candidates)
    return plans


def _same_schedule(rows, record):
    return next((row for row in rows if row.trace_json == record.trace_json), None)


def _scheduled(func, row):
    """The PrimFunc a stored record's schedule makes of `func`."""
    import json

    from tvm.s_tir.schedule import Schedule, Trace

    sch = Schedule(tuning.task_module(func))
    Trace.apply_json_to_schedule(json.loads(row.trace_json), sch)
    return sch.mod["main"]


def _retuned(names, funcs, best, curves, k, target, database, trials, arg_specs, graph, progress) -> dict:
    """Re-tune the layers `names` measured at k units (one runner and builder pool for all of them); {(name, k): the
    faster at k of that and the full-unit best (its curve's time at k, step 2)}."""
    from tvmsched.tune.cpu_units import set_cpu_units

    target_k = with_units(target, k)
    tuned, _ = tuning.tune_layers(
        {name: funcs[name] for name in names}, target_k, scoped(database, target_k, k), trials=trials,
        make_runner=functools.partial(tuning.local_runner, initializer=functools.partial(set_cpu_units, k)),
        progress=progress, desc=f"re-tuning at {k} units",
    )
    found = {}
    for name in names:
        timed = [(curves[name][k], best[name], "tuned")]
        if name in tuned:
            timed.append((measure_at_units(tuned[name], target, arg_specs[name], [k])[k], tuned[name], "retuned"))
        latency, func, kind = min(timed, key=lambda item: item[0])
        found[name, k] = _candidate(-1, k, func, latency, kind, graph, name)
    return found


def with_units(target, k: int):
    """The same llvm target with num-cores = k (what MetaSchedule's rules size parallelism by)."""
    import tvm

    config = {key: str(target.attrs[key]) for key in ("mtriple", "mcpu") if key in target.attrs}
    if "mattr" in target.attrs:
        config["mattr"] = [str(a) for a in target.attrs["mattr"]]
    return tvm.target.Target({"kind": "llvm", **config, "num-cores": k})


def scoped(database, target_k, k: int):
    """The database restricted to records measured at k units, when it can be scoped."""
    store = getattr(database, "store", None)
    if store is None:
        return database
    from tvmsched.tuning_db import TuningDatabase

    return TuningDatabase(store, units=k, unit_kind="cpu_thread", target=target_k)


def _candidate(cid: int, units: int, func, latency_us: float, schedule: str, graph, name: str, mechanism: str = "cpu_threads") -> CandidateKernel:
    import tvm

    from tvmsched.passes.launch_geometry import thread_blocks

    blocks = thread_blocks(tvm.IRModule({"main": func}))
    layer = next(layer for layer in graph.layers if layer.func == name)
    args_bytes = sum(graph.tensors[t].nbytes for t in (*layer.inputs, *layer.outputs))
    return CandidateKernel(cid, units, blocks, latency_us, args_bytes + _workspace_bytes(func), schedule, func, mechanism)


def _workspace_bytes(func) -> int:
    import tvm
    from tvm.s_tir.analysis import calculate_allocated_bytes

    try:
        sizes = calculate_allocated_bytes(tvm.IRModule({"main": func}))
        return int(sum(int(v) for per_func in sizes.values() for v in per_func.values()))
    except Exception:  # informative only
        return 0
