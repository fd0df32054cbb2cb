"""`tvmsched compile`: the ordered stages from an ONNX model to an artifact."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from tvmsched import __version__
from tvmsched.frontend import loader as frontend
from tvmsched.lower import kernels
from tvmsched.lower import relax as lowering
from tvmsched.artifact.format import Artifact, Binding, Candidate, IndexCheck, Layer, Manifest
from tvmsched.errors import TvmschedError
from tvmsched.lower.layers import Graph, extract_graph
from tvmsched.lower.precision import check_precision, recorded_precision, to_precision
from tvmsched.lower.targets import TargetInfo, describe, make_target, target_json

log = logging.getLogger(__name__)


def compile_file(path: str | Path, **options) -> Artifact:
    """Load, check and compile an ONNX file (options as for `compile_model`)."""
    model = frontend.load_onnx(path)
    return compile_model(model, name=Path(path).stem, **options)


def compile_model(
    model: onnx.ModelProto,
    *,
    target: str = "llvm",
    input_shapes: dict | None = None,
    name: str = "model",
    tune_trials: int = 0,
    database=None,
    qos_ms: float | None = None,
    tune_minutes: float | None = None,
    units: list[int] | None = None,
    rpc: str | None = None,
    preempt_checks: bool = True,
    loop_checks: int = 0,
    progress_counters: bool = False,
    index_checks: bool = True,
    batch_size: int | list[int] | None = None,
    precision: str = "fp32",
    progress: bool = False,
) -> Artifact:
    """ONNX → Relax → fused layers → (tuned or default) kernels → artifact (in memory).

    Args:
        model: a checked ONNX model.
        target: "llvm", "cuda", a TVM target tag or a JSON target dict.
        input_shapes: static shapes for inputs whose ONNX shape is dynamic.
        name: the model name recorded in the manifest.
        tune_trials: MetaSchedule trials per distinct layer workload; 0 keeps the default schedules (unless
            `tune_minutes`). With `tune_minutes`, each workload's cap.
        tune_minutes: a time budget for tuning the whole model, split across its workloads by their share of
            the default-schedule latency (tuning.tune_model).
        database: a URL (sqlite, postgresql, http) or a MetaSchedule Database for tuning records. Given
            without `tune_trials`, `tune_minutes` or `qos_ms`: the layers run the database's records for this
            target where they measure faster than the default schedule (no search).
        qos_ms: the model's latency target: build restricted-unit candidates per layer (needs tuning).
        units: unit counts to consider for candidates (default: 1..all units).
        rpc: "HOST:PORT:KEY" of a TVM RPC tracker: measure tuning candidates on its devices.
        preempt_checks: instrument every kernel with preempt-flag checks (after the idempotence analysis).
        loop_checks: K > 0: GPU idempotent kernels also check K times through their blocks' outermost loop (at
            evenly spaced iterations), so a running kernel stops within about 1/K of its time (passes.preempt_flag;
            a barrier per check, docs/preemption.md); 0: block-start checks only.
        progress_counters: kernels count their completed blocks into a per-layer counter (passes.progress).
        index_checks: bounds-check indices read from run-time data (Gather, Scatter*, ...); off only to
            measure what the checks cost: an unchecked artifact reads and writes out of bounds on bad indices.
        batch_size: compile for this many rows, or several sizes (a list): the model's batch dimension is found, the
            model rewritten for each size and checked row by row against onnxruntime (tvmsched.frontend.batching; a
            model whose rows are not independent is refused naming the node). Several sizes make one artifact: the
            largest is its own program, each smaller one a variant with its kernels in the same library and the weights
            stored once. None: the shapes as the model (and `input_shapes`) give them.
        precision: "fp32", or "fp16": fp16 compute with fp32 accumulation, the inputs and outputs as the model declares
            them (tvmsched.lower.precision; "bf16" is refused).
        progress: show a progress bar while tuning (or deciding between records and default schedules).
    """
    info = _check_options(target, qos_ms, tune_trials, tune_minutes, rpc)
    check_precision(precision)
    loop_checks = int(loop_checks)
    if loop_checks < 0 or (loop_checks and not preempt_checks):
        raise TvmschedError(f"--loop-checks {loop_checks}: give K >= 1 (checks per loop) with preempt checks on, or 0")
    sizes = _batch_sizes(batch_size)
    if sizes:
        from tvmsched.frontend import batching

        batching.check_rows(model, input_shapes)

    def program(size: int | None, prefix: str = ""):
        """One compiled program: the model (rewritten for `size` rows) lowered, its kernels chosen and instrumented,
        its manifest; kernel symbols start with `prefix`."""
        source, shapes = model, input_shapes
        if size is not None:
            batched = batching.rebatch(model, size, input_shapes)
            source, shapes = batched.model, batched.input_shapes
            log.info("batch size %d: %d Reshape targets rewritten", size, len(batched.rewritten))
        graph, funcs, tvm_target = lower_model(source, target, shapes, index_checks, precision)
        plan = _choose_kernels(
            graph, funcs, tvm_target, tune_trials=tune_trials, database=database, qos_ms=qos_ms, units=units, rpc=rpc,
            progress=progress, tune_minutes=tune_minutes,
        )
        if preempt_checks:
            plan = _instrumented(plan, gpu=info.gpu, loops=loop_checks)
        if progress_counters:
            plan = _progress_counted(plan, gpu=info.gpu)
        if prefix:
            plan = _prefixed(plan, prefix)
        manifest = _manifest(source, graph, funcs, name, target, tvm_target, plan, qos_ms, precision)
        if size is not None:
            manifest = dataclasses.replace(manifest, batch_size=size)
        return graph, tvm_target, plan, manifest

    graph, tvm_target, plan, manifest = program(sizes[-1] if sizes else None)
    kernels_, weights = dict(plan.kernels), dict(graph.weights)
    variants = []
    for size in sizes[:-1]:  # the smaller sizes: their kernels beside the largest's, the weights they share stored once
        small_graph, _, small_plan, small = program(size, prefix=f"b{size}_")
        kernels_.update(small_plan.kernels)
        variants.append(_variant(small, small_graph.weights, weights))
    library = kernels.build_library(kernels_, tvm_target, extra_sources=_extra_sources(plan, info))
    if variants:
        manifest = dataclasses.replace(manifest, variants=tuple(variants))
    artifact = Artifact(manifest, library, weights)
    if len(sizes) > 1 and info.cpu:
        artifact = _timed_sizes(artifact)
    log.info("compiled %s: %d layers, %d kernels", name, len(graph.layers), len(kernels_))
    return artifact


def _batch_sizes(batch_size) -> list[int]:
    """compile_model's batch_size (a size, several, or None) as distinct sizes, smallest first (one error line for a
    size below 1)."""
    if batch_size is None:
        return []
    sizes = [batch_size] if isinstance(batch_size, int) else list(batch_size)
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise TvmschedError(f"batch sizes must be positive row counts, not {batch_size!r}")
    return sorted(set(sizes))


def _prefixed(plan: KernelPlan, prefix: str) -> KernelPlan:
    """The plan with every kernel symbol starting with `prefix` (a smaller batch size's kernels in one library)."""
    return dataclasses.replace(
        plan,
        kernels={prefix + symbol: func for symbol, func in plan.kernels.items()},
        candidates={f: [dataclasses.replace(c, kernel=prefix + c.kernel) for c in cands] for f, cands in plan.candidates.items()},
    )


def _variant(manifest: Manifest, own: dict, weights: dict):
    """A smaller size's program as a BatchVariant; its weights join `weights` (those already there with the same bytes
    are shared; one with other bytes under the same id is kept under the id suffixed with its size)."""
    import numpy as np

    from tvmsched.artifact.format import BatchVariant

    renamed = {}
    for tid, array in own.items():
        if tid in weights and not (weights[tid].dtype == array.dtype and np.array_equal(weights[tid], array)):
            renamed[tid] = f"{tid}@b{manifest.batch_size}"
        weights[renamed.get(tid, tid)] = array
    name = lambda t: renamed.get(t, t)  # noqa: E731
    layers = tuple(dataclasses.replace(l, inputs=tuple(map(name, l.inputs)), outputs=tuple(map(name, l.outputs)))
                   for l in manifest.layers)
    return BatchVariant(
        batch_size=manifest.batch_size,
        inputs=tuple(Binding(b.name, name(b.tensor)) for b in manifest.inputs),
        outputs=tuple(Binding(b.name, name(b.tensor)) for b in manifest.outputs),
        tensors={name(t): spec for t, spec in manifest.tensors.items()},
        layers=layers,
        index_checks=tuple(dataclasses.replace(c, tensor=name(c.tensor)) for c in manifest.index_checks),
    )


def _timed_sizes(artifact: Artifact) -> Artifact:
    """Each batch size's run at candidate 0 on this CPU (median of 20 after 3 warm-up runs), into the manifest: what
    `inspect` shows and what a runtime assumes until it measures on its own device."""
    import tempfile

    from tvmsched.runtime import Executor

    measured = {}
    with tempfile.TemporaryDirectory(prefix="tvmsched-sizes-") as tmp:
        path = Path(tmp) / "sizes.tvms"
        artifact.save(path)
        for size in artifact.manifest.batch_sizes:
            executor = Executor(str(path), batch_size=size)
            runs = executor.time_runs(executor.random_inputs(0), repeat=20, warmup=3)
            measured[size] = round(sorted(runs)[len(runs) // 2] * 1e6, 3)
    manifest = artifact.manifest
    manifest = dataclasses.replace(
        manifest, batch_latency_us=measured[manifest.batch_size],
        variants=tuple(dataclasses.replace(v, latency_us=measured[v.batch_size]) for v in manifest.variants),
    )
    return dataclasses.replace(artifact, manifest=manifest)


def lower_model(
    model: onnx.ModelProto, target="llvm", input_shapes: dict | None = None, index_checks: bool = True,
    precision: str = "fp32",
):
    """ONNX → Relax (→ mixed precision) → fused layers: (Graph, {PrimFunc name: unscheduled PrimFunc}, tvm Target).

    With `index_checks` (the default), indices read from run-time data are bounds-checked: the
    graph's `index_checks` pair each check's int32 flag tensor with the node it guards.
    """
    from tvmsched.frontend import validate

    validate.check_model(model)  # what onnxruntime rejects (TVM's importer converts it regardless)
    signature = frontend.input_signature(model, input_shapes)
    frontend.check_supported_ops(model)
    tvm_target = make_target(target)
    validate.check_tensor_sizes(model, signature, tvm_target)  # before TVM folds constants or the engine allocates
    mixed = check_precision(precision) != "fp32"
    mod, checks = frontend.import_model(model, signature, check_indices=index_checks, mixed_precision=mixed,
                                        relax_forms=describe(tvm_target).cpu)
    mod = lowering.legalize_and_fuse(to_precision(mod, precision), tvm_target, clamp_take=index_checks)
    graph = extract_graph(mod)
    if checks:
        from tvmsched.frontend.index_checks import WORD_BITS

        words = -(-len(checks) // WORD_BITS)
        flags, graph.outputs = graph.outputs[-words:], graph.outputs[:-words]
        graph.index_checks = _live_checks(graph, flags, checks)
    all_funcs = kernels.layer_funcs(mod)
    funcs = {f: all_funcs[f] for f in dict.fromkeys(layer.func for layer in graph.layers)}
    return graph, funcs, tvm_target


def _live_checks(graph: Graph, words: list[str], checks: list) -> list:
    """(word tensor, bit, check) of the checks whose flag words are computed at run time; a word TVM
    folded to a constant is dropped (its indices were constant after all), or a compile error when
    that constant says out of range."""
    from tvmsched.frontend.index_checks import WORD_BITS
    from tvmsched.frontend.index_checks import describe as describe_check

    live = []
    for number, word in enumerate(words):
        spec, group = graph.tensors[word], checks[number * WORD_BITS : (number + 1) * WORD_BITS]
        if spec.shape != () or spec.dtype != "int32":
            raise TvmschedError(f"internal: index-check word {number} became a {spec.dtype}{list(spec.shape)} tensor")
        for bit, check in enumerate(group):
            if spec.kind == "activation":
                live.append((word, bit, check))
            elif int(graph.weights[word]) >> bit & 1:
                raise TvmschedError(f"index out of range at compile time: {describe_check(check)}")
    return live


@dataclass
class KernelPlan:
    """What gets built: kernel symbol -> PrimFunc, and per PrimFunc its candidates and QoS bound."""

    kernels: dict[str, object]
    candidates: dict[str, list[Candidate]]
    bounds: dict[str, float] = field(default_factory=dict)
    tuning: dict | None = None
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    preempt_flags: int = 0
    progress_counters: bool = False


def _progress_counted(plan: KernelPlan, *, gpu: bool) -> KernelPlan:
    """Every kernel also counts its completed blocks (passes.progress)."""
    from tvmsched.passes.progress import count_progress

    kernels_, facts = {}, {}
    for symbol, func in plan.kernels.items():
        counted = count_progress(func, gpu=gpu)
        kernels_[symbol] = counted.func
        facts[symbol] = {"threads": counted.threads, "progress_blocks": counted.blocks}
    candidates = {f: [dataclasses.replace(c, **facts[c.kernel]) for c in cands] for f, cands in plan.candidates.items()}
    return dataclasses.replace(plan, kernels=kernels_, candidates=candidates, progress_counters=True)


def _check_options(target: str, qos_ms, tune_trials: int, tune_minutes, rpc) -> TargetInfo:
    """compile_model's options that do not go together (one user error each); the target's description."""
    if qos_ms is not None and qos_ms <= 0:
        raise TvmschedError("--qos-ms needs a positive target")
    check_tuning_budget(tune_trials, tune_minutes, qos_ms)
    if rpc is not None and ((tune_trials <= 0 and tune_minutes is None) or qos_ms is not None):
        raise TvmschedError("--rpc measures tuning trials: it needs --tune-trials > 0 or --tune-minutes, and no --qos-ms (not supported yet)")
    info = describe(make_target(target))
    if qos_ms is not None and tune_trials > 0 and not info.cpu:
        raise TvmschedError(
            f"restricted-unit tuning on {info.kind} measures on the device machine: build, measure and import a kit "
            "(tvmsched tune kit / tune measure / tune import), then compile with --qos-ms and no --tune-trials"
        )
    return info


def _extra_sources(plan: KernelPlan, info: TargetInfo) -> dict[str, str]:
    """C sources linked into the kernel library: the atomic add of CPU progress counters."""
    if plan.progress_counters and info.cpu:
        from tvmsched.passes.progress import CPU_SOURCE

        return {"progress.cc": CPU_SOURCE}
    return {}


def _instrumented(plan: KernelPlan, *, gpu: bool, loops: int = 0) -> KernelPlan:
    """Every kernel analysed for idempotence and given its preempt-flag checks (passes/)."""
    from tvmsched.passes.idempotence import analyze
    from tvmsched.passes.preempt_flag import FLAG_LEN, instrument

    kernels_, facts = {}, {}
    for symbol, func in plan.kernels.items():
        verdict = analyze(func)
        kernels_[symbol], check = instrument(func, idempotent=verdict.idempotent, gpu=gpu, loops=loops)
        facts[symbol] = {"idempotent": verdict.idempotent, "idempotence": verdict.reason, "preempt_check": check}
    candidates = {
        func: [dataclasses.replace(c, **facts[c.kernel]) for c in cands] for func, cands in plan.candidates.items()
    }
    return dataclasses.replace(plan, kernels=kernels_, candidates=candidates, preempt_flags=FLAG_LEN)


def _choose_kernels(
    graph, funcs: dict, tvm_target, *, tune_trials, database, qos_ms, units, rpc, progress, tune_minutes=None
) -> KernelPlan:
    """Default schedules; tuned ones when tuning (where they measure faster); restricted-unit candidates
    when a QoS target is set."""
    default, gpu = describe(tvm_target).default_schedule, describe(tvm_target).gpu
    scheduled = kernels.default_schedule(funcs, tvm_target)
    tuned, summary = {}, None
    searching = tune_trials > 0 or tune_minutes is not None
    if searching or (database is not None and qos_ms is None):  # without a search: the database's records
        database = open_tuning_database(database, tvm_target)
        tuned, summary = _tune(
            funcs, tvm_target, database, tune_trials, rpc, progress, graph=graph, defaults=scheduled, minutes=tune_minutes,
            records_only=not searching,
        )
        scheduled.update(tuned)
    if qos_ms is None:
        return KernelPlan(
            {kernels.kernel_symbol(f, 0): scheduled[f] for f in funcs},
            {f: [_single_candidate(f, scheduled[f], "tuned" if f in tuned else kernels.schedule_name(scheduled[f], default),
                                   kernels.gpu_path(funcs[f], scheduled[f]) if gpu else (None, None))]
             for f in funcs},
            tuning=summary,
        )
    from tvmsched.tune.candidates import plan_candidates, plan_from_records

    if tune_trials > 0:
        plans = plan_candidates(graph, funcs, scheduled, tvm_target, database, qos_ms=qos_ms, units=units, trials=tune_trials, progress=progress)
    else:  # candidates from records measured elsewhere (a kit measured on the device machine)
        database = open_tuning_database(database, tvm_target)
        plans = plan_from_records(graph, funcs, tvm_target, database, qos_ms=qos_ms, units=units)
        url = getattr(database.store, "url", type(database).__name__)
        message = "candidates from records measured on the device"
        summary = {"trials_per_layer": 0, "database": url,
                   "layers": {f: {"status": "cached", "trials": 0, "seconds": 0.0, "message": message} for f in funcs}}
    return KernelPlan(
        {kernels.kernel_symbol(f, c.id): c.func for f, p in plans.items() for c in p.candidates},
        {f: [_manifest_candidate(f, c, kernels.gpu_path(funcs[f], c.func) if gpu else (None, None))
             for c in p.candidates] for f, p in plans.items()},
        {f: p.bound_us for f, p in plans.items()},
        summary,
        {f: p.curve_us for f, p in plans.items()},
    )


def _single_candidate(func: str, scheduled, schedule: str, path: tuple[str | None, str | None]) -> Candidate:
    """Candidate 0 of a layer built for all units, with its thread-block count and its GPU path and why."""
    import tvm

    from tvmsched.passes.launch_geometry import thread_blocks

    return Candidate(0, kernels.kernel_symbol(func, 0), schedule, blocks=thread_blocks(tvm.IRModule({"main": scheduled})),
                     path=path[0], path_reason=path[1])


def _manifest_candidate(func: str, c, path: tuple[str | None, str | None]) -> Candidate:
    return Candidate(
        c.id, kernels.kernel_symbol(func, c.id), c.schedule, c.units, c.blocks, c.latency_us, c.memory_bytes, c.mechanism,
        path=path[0], path_reason=path[1],
    )


def open_tuning_database(database, tvm_target, token: str | None = None):
    """A URL (None: the default SQLite file) becomes a TuningDatabase scoped to the target's full units."""
    if database is not None and not isinstance(database, str):
        return database
    from tvmsched.tuning_db import open_database

    units = int(tvm_target.attrs.get("num-cores", 0)) if describe(tvm_target).cpu else 0  # GPUs: 0 = all SMs
    return open_database(database, target=tvm_target, units=units, token=token)


def check_tuning_budget(tune_trials: int, tune_minutes: float | None, qos_ms: float | None) -> None:
    """--tune-trials N (trials per workload) and --tune-minutes M (a budget for the model) combine: with
    both, M is split across the workloads and N caps each one."""
    import math

    if tune_trials < 0:
        raise TvmschedError("--tune-trials must be >= 0")
    if tune_trials > 0 or tune_minutes is not None:
        from tvmsched.extras import require

        require("tune", "tuning (--tune-trials, --tune-minutes)")
        from tvmsched.tune.search import measure_ms

        measure_ms()  # a bad TVMSCHED_TUNE_MEASURE_MS is one line now, not after lowering
    if tune_minutes is None:
        return
    if not math.isfinite(tune_minutes) or tune_minutes <= 0:
        raise TvmschedError(f"--tune-minutes must be a positive number of minutes, not {tune_minutes:g}")
    if qos_ms is not None:
        raise TvmschedError("--tune-minutes does not apply to --qos-ms candidate builds yet: give them --tune-trials")


def _tune(
    funcs: dict, tvm_target, database, trials: int, rpc: str | None, progress: bool, *, graph: Graph,
    defaults: dict, minutes: float | None = None, records_only: bool = False,
) -> tuple[dict, dict]:
    """Tune each distinct workload into the database (tuning.tune_model; with `records_only`, search nothing
    and use the records already there); returns the PrimFuncs whose tuned kernel won against the default
    schedule, and a summary for the manifest."""
    from collections import Counter

    from tvmsched.tune import search as tuning

    url = getattr(getattr(database, "store", None), "url", type(database).__name__)
    runner = tuning.rpc_runner(rpc) if rpc else None
    counts = Counter(layer.func for layer in graph.layers)
    measure = None if rpc else _layer_timer(graph, tvm_target)
    run = tuning.tune_model(
        funcs, tvm_target, database, trials=trials, minutes=minutes, layer_counts=counts, defaults=defaults,
        measure=measure, seed_schedule=tuning.default_seed_schedule(tvm_target), runner=runner, progress=progress,
        records_only=records_only,
    )
    summary = {
        "trials_per_layer": trials if trials > 0 else None,  # per distinct workload (None: set by the budget)
        "tune_minutes": minutes,
        "records_only": records_only,
        "database": url,
        "workloads": run.workloads,
        "layer_count": run.layers,
        "trials": run.trials,
        "tuning_seconds": round(run.tune_seconds, 2),
        "seconds": round(run.seconds, 2),
        "trials_per_minute": round(run.trials_per_minute, 2),
        "deadline_hit": run.deadline_hit,
        "seeded": run.seeded,
        "layers": {r.func: _tuning_entry(r) for r in run.report},
    }
    return run.scheduled, summary


def _tuning_entry(r) -> dict:
    """One PrimFunc's line of the manifest's tuning summary (latencies in us, None where not measured)."""
    rounded = lambda us: None if us is None else round(us, 3)  # noqa: E731
    kernel = r.kernel or "default"
    return {
        "status": r.status, "trials": r.trials, "seconds": round(r.seconds, 2), "message": r.message,
        "workload": r.workload, "layers": r.layers, "planned_trials": r.planned_trials, "seeded": r.seeded,
        "default_us": rounded(r.default_us), "tuned_us": rounded(r.tuned_us),
        "best_us": rounded(r.tuned_us if kernel == "tuned" else r.default_us), "kernel": kernel,
    }


def _layer_timer(graph, tvm_target):
    """A `measure(name, func)` (tuning.tune_model) timing scheduled PrimFuncs at all units on random data of
    the layer's shapes, with `.many({name: func})` to time a batch built as one module and `.pair(name, a, b)`
    two schedules of one layer side by side; None where kernels of the target cannot run here."""
    if not describe(tvm_target).cpu:
        return None
    return _LayerTimer(graph, tvm_target)


class _LayerTimer:
    """Median of 5 timed batches of at least 10 ms each (TVM's evaluator runs the kernel once untimed first),
    on a thread whose TVM pool has all units: ~60 ms per kernel, enough to split a budget. Two kernels of one
    layer (`pair`, the keep-or-drop decision) are timed cold instead, as in the model (measure_together's
    `cold`, COLD_RUNS runs each): warm, a tuned llama-small down-projection measured 2% faster than the default
    and ran 52% slower in the model."""

    REPEAT, MIN_REPEAT_MS, COLD_RUNS = 5, 10, 30

    def __init__(self, graph, tvm_target) -> None:
        from tvmsched.tune.candidates import cpu_units
        from tvmsched.lower.layers import arg_specs

        self.specs, self.target, self.units = arg_specs(graph), tvm_target, cpu_units(tvm_target)

    def __call__(self, name: str, func) -> float:
        return self.many({name: func})[name]

    def many(self, funcs: dict) -> dict[str, float]:
        """{name: us} of a batch of PrimFuncs, compiled together."""
        return dict(zip(funcs, self._time(list(funcs.items()))))

    def pair(self, name: str, first, second) -> tuple[float, float]:
        """(us, us) of two schedules of `name`, timed in alternation (a drifting machine slows both alike)."""
        return tuple(self._time([(name, first), (name, second)], cold=True))

    def _time(self, entries: list, cold: bool = False) -> list[float]:
        """Median us of each (name, PrimFunc), built as one module; the kernels take turns batch by batch."""
        from tvmsched.tune.local_timing import measure_together

        return measure_together([(f, self.specs[name]) for name, f in entries], self.target, self.units,
                                repeat=self.COLD_RUNS if cold else self.REPEAT, min_repeat_ms=self.MIN_REPEAT_MS, cold=cold)


def _manifest(
    model, graph: Graph, funcs: dict, name: str, target: str, tvm_target, plan: KernelPlan, qos_ms: float | None,
    precision: str = "fp32",
) -> Manifest:
    import tvm

    from tvmsched.frontend.index_checks import describe as describe_check
    from tvmsched.lower.targets import cpu_requirements, gpu_sms

    output_names = [value.name for value in model.graph.output]
    if len(output_names) != len(graph.outputs):
        raise TvmschedError(f"the model declares {len(output_names)} outputs but computes {len(graph.outputs)}")
    info = describe(tvm_target)
    device = info.device
    cpu, cpu_features, cpu_unchecked = cpu_requirements(tvm_target)
    layers = tuple(
        Layer(
            index=layer.index,
            func=layer.func,
            inputs=layer.inputs,
            outputs=layer.outputs,
            flops=kernels.estimated_flops(funcs[layer.func]),
            bytes=sum(graph.tensors[t].nbytes for t in (*layer.inputs, *layer.outputs)),
            candidates=tuple(plan.candidates[layer.func]),
            qos_bound_us=plan.bounds.get(layer.func),
            unit_latency_us={str(k): t for k, t in plan.curves[layer.func].items()} if plan.curves else None,
        )
        for layer in graph.layers
    )
    return Manifest(
        model_name=name,
        target=target_json(target),
        device=device,
        cpu=cpu,
        cpu_features=cpu_features,
        cpu_features_unchecked=cpu_unchecked,
        gpu_sms=gpu_sms(tvm_target) if info.gpu else None,
        device_code=kernels.cuda_device_code() if info.gpu else "native",
        inputs=tuple(Binding(n, t) for n, t in zip(frontend.input_signature_names(model), graph.inputs)),
        outputs=tuple(Binding(n, t) for n, t in zip(output_names, graph.outputs)),
        tensors=dict(graph.tensors),
        layers=layers,
        tvmsched_version=__version__,
        tvm_version=tvm.__version__,
        tuning=plan.tuning,
        qos_ms=qos_ms,
        precision=recorded_precision(model, precision),
        preempt_flags=plan.preempt_flags,
        progress_counters=plan.progress_counters,
        index_checks=tuple(
            IndexCheck(tensor, bit, c.op, c.node, c.indices, c.bounds, describe_check(c))
            for tensor, bit, c in graph.index_checks
        ),
    )
