"""Stage 4a: tune each layer with MetaSchedule into a tuning database, then read the best schedules.

Uses the builder fix from ../shared/tvm-notes.md: candidates are built by a function that does not
import `tvm.s_tir.tensor_intrin` (a 25-35 s import that times out the default builder's workers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import logging
import random
import os
import signal
import sys
import threading
import tempfile
import time
import types
from dataclasses import dataclass

from tvmsched.lower import kernels
from tvmsched.tune import worker_pools
from tvmsched.lower.intrinsics import load_tensor_intrinsics
from tvmsched.errors import TvmschedError, one_line, whole_number_from_env
from tvmsched.lower.targets import describe

log = logging.getLogger(__name__)


def _register_user_error_with_ffi() -> None:
    """Let a TvmschedError raised inside a database callback come back out of MetaSchedule as itself."""
    import tvm_ffi

    tvm_ffi.register_error(TvmschedError)


_register_user_error_with_ffi()

BUILD_TIMEOUT_S = 60
RUN_TIMEOUT_S = 120  # generous: a loaded 2-core machine makes MetaSchedule's 30 s default time out


@dataclass(frozen=True)
class LayerTuning:
    """What tuning did for one PrimFunc (for `tune_model`: for its workload, shared by equal PrimFuncs)."""

    func: str
    # "tuned" (new records, the tuned kernel won) | "cached" (records already in the database) |
    # "default-kept" (tuned now, but the default schedule measured faster) | "fallback" (no valid record) |
    # "skipped" (the --tune-minutes deadline came first, or records only and none in the database)
    status: str
    trials: int  # new records committed by this run (the seeded default record not counted)
    seconds: float
    message: str = ""
    workload: str = ""  # the PrimFunc whose tuning this one shares (itself for the representative)
    layers: int = 1  # model layers running this workload (all its equal PrimFuncs)
    planned_trials: int = 0  # the trials it was given (budget share, or --tune-trials)
    default_us: float | None = None  # measured latency of the default schedule (None: not measured here)
    tuned_us: float | None = None  # measured latency of the best tuning record's kernel
    kernel: str = ""  # which one the artifact runs: "tuned" | "default"
    seeded: bool = False  # the default schedule was committed as the search's starting record


def build_candidate(mod, target, _params=None):
    """MetaSchedule builder function (runs in builder workers); skips the tensor-intrinsic import."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    with target:
        return build(mod, target=target)


class _PoolSubprocess:
    """`subprocess` as tvm.support.popen_pool sees it once `workers_started_by_tvmsched()` ran: the same, except that the
    worker command `python -m tvm.exec.popen_worker FD FD` becomes `python -m tvmsched.tune.popen_worker FD FD`."""

    TVM_WORKER, OURS = ["-m", "tvm.exec.popen_worker"], ["-m", "tvmsched.tune.popen_worker"]

    def __getattr__(self, name):
        import subprocess

        return getattr(subprocess, name)

    def Popen(self, cmd, *args, **kwargs):  # noqa: N802 - subprocess's name
        import subprocess

        if isinstance(cmd, list) and cmd[1:3] == self.TVM_WORKER:
            cmd = [cmd[0], *self.OURS, *cmd[3:]]
        return subprocess.Popen(cmd, *args, **kwargs)


def workers_started_by_tvmsched() -> None:
    """Start the worker processes of TVM's popen pools (MetaSchedule's builders and runners) as
    `tvmsched.tune.popen_worker`: TVM's worker loop with torch hidden while TVM loads (~4 s less per worker where torch
    is installed; LocalBuilder starts a pool per batch). Idempotent; touches nothing else."""
    from tvm.support import popen_pool

    if not isinstance(popen_pool.subprocess, _PoolSubprocess):
        popen_pool.subprocess = _PoolSubprocess()


def make_builder(timeout_s: int = BUILD_TIMEOUT_S, max_workers: int | None = None):
    import tvm.s_tir.meta_schedule as ms

    workers_started_by_tvmsched()
    return ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=timeout_s, max_workers=max_workers,
                                   initializer=worker_initializer())


def worker_initializer(then=None):
    """The initializer of our MetaSchedule workers: die with this process (`die_with_parent`), then run `then`."""
    return functools.partial(die_with_parent, os.getpid(), then)


def die_with_parent(parent: int, then=None) -> None:
    """In a MetaSchedule worker process: be killed when `parent`, the process that started it, dies (Linux),
    then run `then`. A compile killed, timed out or crashed otherwise leaves its build and run workers behind,
    re-parented to init, each holding TVM's memory."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the prctl (a parent that is PID 1 is fine)
            os._exit(1)
    except (OSError, AttributeError):  # not Linux: workers end when their pipe closes, as before
        pass
    if then is not None:
        then()


BUILDS_PER_WORKER = 256  # a pooled build worker is replaced after this many builds (TVM's workers leak memory)
_POOLED_BUILDER = None


def pooled_builder(timeout_s: int = BUILD_TIMEOUT_S, max_workers: int | None = None):
    """A MetaSchedule builder like `make_builder`'s whose worker processes live across search iterations and
    workloads: LocalBuilder starts a fresh pool for every batch (and one more to check itself), each worker
    importing TVM, about 6 s per batch on a loaded 2-core machine. Call `.close()` when done: the pool is then kept
    a while for the next tuning in this process (`worker_pools`)."""
    global _POOLED_BUILDER
    if _POOLED_BUILDER is None:
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
        from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
        from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

        workers_started_by_tvmsched()

        @derived_object
        class PooledBuilder(PyBuilder):
            def __init__(self, timeout_s, max_workers):
                super().__init__()
                self.timeout_s = timeout_s
                self.pool_key = ("build", timeout_s, max_workers or os.cpu_count() or 1)
                self.pool = worker_pools.take(self.pool_key, lambda: PopenPoolExecutor(
                    max_workers=self.pool_key[2], timeout=timeout_s, maximum_process_uses=BUILDS_PER_WORKER,
                    initializer=worker_initializer(),
                ))

            def build(self, build_inputs):
                jobs = [(build_candidate, None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
                results = []
                for done in self.pool.map_with_error_catching(lambda job: _worker_func(*job), jobs):
                    if done.status == StatusKind.COMPLETE:
                        results.append(BuilderResult(done.value, None))
                    elif done.status == StatusKind.TIMEOUT:
                        results.append(BuilderResult(None, f"PooledBuilder: Timeout, killed after {self.timeout_s} seconds"))
                    else:
                        results.append(BuilderResult(None, f"PooledBuilder: An exception occurred\n{done.value}"))
                return results

            def close(self) -> None:
                """Its pool goes back to `worker_pools` for the next tuning (shut down there when left idle)."""
                if self.pool is not None:
                    worker_pools.give_back(self.pool_key, self.pool)
                    self.pool = None

        _POOLED_BUILDER = PooledBuilder
    return _POOLED_BUILDER(timeout_s, max_workers)


def rpc_runner(spec: str, session_timeout_s: int = 60):
    """A MetaSchedule RPCRunner measuring on devices registered with a TVM RPC tracker.

    Args:
        spec: "HOST:PORT:KEY" of the tracker (`python -m tvm.exec.rpc_tracker`) and the device key
            the servers registered with (`python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY`).
    """
    import tvm.s_tir.meta_schedule as ms

    host, port, key = (spec.split(":") + ["", "", ""])[:3]
    if spec.count(":") != 2 or not host or not port.isdigit() or not key:
        raise TvmschedError(f"--rpc {spec!r} is not of the form HOST:PORT:KEY")
    workers_started_by_tvmsched()
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key, session_timeout_sec=session_timeout_s)
    return ms.runner.RPCRunner(rpc_config=config)


def local_runner(initializer=None):
    """MetaSchedule's LocalRunner with a generous timeout; `initializer` runs in its worker."""
    import tvm.s_tir.meta_schedule as ms

    workers_started_by_tvmsched()
    config = ms.runner.EvaluatorConfig(min_repeat_ms=measure_ms())
    return ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S, evaluator_config=config,
                                 initializer=worker_initializer(initializer))


MEASURE_MS = 100  # MetaSchedule's default: each candidate's timed runs last at least this long


def measure_ms() -> int:
    """How long MetaSchedule times each candidate at least (ms): MEASURE_MS, or TVMSCHED_TUNE_MEASURE_MS (the test suite
    sets 10: its tuning checks the plumbing, not the kernels' speed)."""
    return whole_number_from_env("TVMSCHED_TUNE_MEASURE_MS", MEASURE_MS, 1, 60_000, "milliseconds")


def task_module(func):
    """The IRModule MetaSchedule tunes and keys its database by: a deep copy of the PrimFunc as `main`.

    The copy matters: when Python holds the only reference, `with_attr` and schedule primitives
    modify the PrimFunc in place (see docs/tvm-pitfalls.md).
    """
    import tvm

    copy = tvm.ir.load_json(tvm.ir.save_json(func))
    return tvm.IRModule({"main": copy.with_attr("global_symbol", "main")})


def best_schedule(database, func, target):
    """The best recorded schedule of `func` for `target`, as a PrimFunc, or None."""
    import tvm.s_tir.meta_schedule as ms

    sch = ms.tir_integration.compile_tir(database, task_module(func), target)
    return None if sch is None else sch.mod["main"]


def tune_layers(
    funcs: dict[str, object],
    target,
    database,
    *,
    trials: int,
    runner=None,
    make_runner=None,
    progress: bool = True,
    desc: str = "tuning",
) -> tuple[dict[str, object], list[LayerTuning]]:
    """Tune every PrimFunc that has no record yet, then return the best schedule of each.

    Args:
        funcs: PrimFunc name -> unscheduled PrimFunc.
        target: the tvm Target (llvm targets need "num-cores").
        database: a MetaSchedule Database (e.g. tvmsched.tuning_db.open_database(url)).
        trials: MetaSchedule trial budget per layer.
        runner: MetaSchedule runner (default: LocalRunner; RPCRunner for remote GPUs).
        make_runner: instead of `runner`, makes it when the first layer without a record is tuned (a LocalRunner
            starts a worker process and checks it at construction).

    Returns:
        ({name: scheduled PrimFunc} for the layers with a valid record, one LayerTuning per func). One builder pool and
        one runner serve all the layers; neither is started when every layer has a record.
    """
    from tqdm import tqdm

    scheduled, report = {}, []
    bar = tqdm(funcs.items(), total=len(funcs), desc=desc, unit="layer", disable=not progress, file=sys.stderr)
    builder = None
    with bar, tensor_intrinsics(target), _interruptible() as interrupted, contextlib.ExitStack() as stack:
        for name, func in bar:
            bar.set_postfix_str(name[:40])
            if database.query_tuning_record(task_module(func), target, "main") is not None:
                outcome = LayerTuning(name, "cached", 0, 0.0)
            else:
                if builder is None:
                    builder = pooled_builder()
                    stack.callback(builder.close)
                if runner is None:
                    runner = (make_runner or local_runner)()
                outcome = _tune_one(name, func, target, database, trials, runner, builder)
            if interrupted.is_set():  # Ctrl-C during that layer: stop here, between layers (its records are saved)
                raise KeyboardInterrupt
            best = best_schedule(database, func, target)
            if best is None:
                outcome = LayerTuning(name, "fallback", outcome.trials, outcome.seconds, outcome.message or "no valid record")
                log.warning("layer %s: no valid tuning record (%s); it keeps the default schedule", name, outcome.message)
            else:
                scheduled[name] = best
            report.append(outcome)
            if progress:
                bar.write(f"  {name}: {outcome.status}, {outcome.trials} trials, {outcome.seconds:.1f} s", file=sys.stderr)
    return scheduled, report


# ---- whole models: one tuning per workload, a time budget, the default schedule as the floor ----------------

MIN_TRIALS = 8  # per workload under --tune-minutes: one small search iteration
BUDGET_TRIALS_PER_ITER = 16  # search iterations under a budget (the deadline is checked between iterations)
PRIOR_TRIALS_PER_MINUTE = 30.0  # until this run has measured its own rate (2 cores: convs ~20-30/min, matmuls ~80/min)
OVERRUN = 1.25  # a workload may run this far past its share of the remaining time before it is stopped


@dataclass(frozen=True)
class Workload:
    """Structurally equal PrimFuncs (one MetaSchedule workload: the task module's structural hash) and
    how many model layers run them."""

    name: str  # the representative: the first of `members` in model order
    func: object
    members: tuple[str, ...]
    layers: int


def group_workloads(funcs: dict[str, object], layer_counts: dict[str, int] | None = None) -> list[Workload]:
    """Group PrimFuncs by structural equality of their task modules (the global symbol set to "main",
    so names do not matter), in first-seen order. `layer_counts`: layers calling each PrimFunc (default 1)."""
    import tvm_ffi

    counts = layer_counts or {}
    buckets: dict[int, list[tuple[object, list[str]]]] = {}
    ordered: list[list[str]] = []
    for name, func in funcs.items():
        mod = task_module(func)
        entries = buckets.setdefault(tvm_ffi.structural_hash(mod), [])
        for other, names in entries:
            if tvm_ffi.structural_equal(other, mod):
                names.append(name)
                break
        else:
            entries.append((mod, [name]))
            ordered.append(entries[-1][1])
    return [Workload(names[0], funcs[names[0]], tuple(names), sum(counts.get(n, 1) for n in names)) for names in ordered]


@dataclass
class TuningRun:
    """What `tune_model` did: the kernels to use and the numbers for the manifest."""

    scheduled: dict[str, object]  # PrimFunc name -> tuned PrimFunc, only where the tuned kernel won
    report: list[LayerTuning]  # one per PrimFunc, in the order of `funcs`
    workloads: int
    layers: int
    trials: int  # new records (seeded defaults not counted)
    tune_seconds: float  # spent inside MetaSchedule
    seconds: float  # the whole stage: measuring, seeding, tuning, comparing
    minutes: float | None
    deadline_hit: bool
    seeded: int

    @property
    def trials_per_minute(self) -> float:
        return 60.0 * self.trials / self.tune_seconds if self.tune_seconds > 0 else 0.0


def budget_share(left_s: float, weight: float, remaining_weight: float, rate_per_s: float, cap: int = 0) -> tuple[int, float]:
    """(trials, seconds) of a workload: its weight's share of the time left to the workloads not tuned yet,
    at the measured trials per second; at least MIN_TRIALS, at most `cap` (0: no cap)."""
    seconds = left_s * weight / remaining_weight if remaining_weight > 0 else left_s
    trials = max(MIN_TRIALS, round(seconds * rate_per_s))
    return (min(trials, cap) if cap > 0 else trials), seconds


class _Stopper:
    """Decides, before each search iteration, whether a workload's tuning goes on (see `_deadline_search`)."""

    def __init__(self, deadline: float | None, stop_at: float | None, per_iter: int, interrupted=None) -> None:
        self.deadline, self.stop_at, self.per_iter, self.interrupted = deadline, stop_at, per_iter, interrupted
        self.started = time.monotonic()
        self.measured = 0
        self.stopped_by: str | None = None  # "deadline" | "share" | "interrupt" when it ended the search early

    def __call__(self) -> bool:
        now = time.monotonic()
        if self.interrupted is not None and self.interrupted.is_set():  # Ctrl-C: end this workload now
            self.stopped_by = "interrupt"
            return True
        if self.measured == 0:  # the first iteration always runs, unless the model's deadline has passed
            if self.deadline is not None and now >= self.deadline:
                self.stopped_by = "deadline"
                return True
            return False
        next_end = now + (now - self.started) / self.measured * self.per_iter  # when another iteration would end
        if self.deadline is not None and next_end > self.deadline:
            self.stopped_by = "deadline"
        elif self.stop_at is not None and next_end > self.stop_at and self.measured >= MIN_TRIALS:
            self.stopped_by = "share"
        return self.stopped_by is not None


_DEADLINE_SEARCH = None


def _deadline_search(inner, stopper: _Stopper):
    """`inner` (an EvolutionarySearch) that ends when `stopper()` says so: no more candidates, so
    MetaSchedule's task scheduler terminates the task itself (terminating it from a measure callback
    trips the scheduler's checks). The population, cost model and database seeding are inner's."""
    global _DEADLINE_SEARCH
    if _DEADLINE_SEARCH is None:
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy

        @derived_object
        class DeadlineSearch(PySearchStrategy):
            def __init__(self, inner, stopper):
                self.inner, self.stopper = inner, stopper

            def _initialize_with_tune_context(self, context) -> None:
                self.inner._initialize_with_tune_context(context)

            def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None, cost_model=None):
                self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

            def post_tuning(self) -> None:
                self.inner.post_tuning()

            def generate_measure_candidates(self):
                if self.stopper():
                    return None
                return self.inner.generate_measure_candidates()

            def notify_runner_results(self, measure_candidates, results) -> None:
                self.stopper.measured += len(results)
                self.inner.notify_runner_results(measure_candidates, results)

            def clone(self):
                return DeadlineSearch(self.inner.clone(), self.stopper)

        _DEADLINE_SEARCH = DeadlineSearch
    return _DEADLINE_SEARCH(inner, stopper)


@contextlib.contextmanager
def _work_dir(folder: str | None):
    """MetaSchedule's work folder (its per-task logs): `folder` when given and kept, else a temporary one."""
    if folder is not None:
        os.makedirs(folder, exist_ok=True)
        yield folder
        return
    with tempfile.TemporaryDirectory(prefix="tvmsched-tune-") as tmp:
        yield tmp


def default_seed_schedule(target):
    """`tvmsched.lower.cpu_schedule.schedule(func, target)` (a tvm.s_tir.Schedule with its trace, or None) where it
    exists and the target is a CPU; None otherwise (no seeding)."""
    if not describe(target).cpu:
        return None
    try:
        from tvmsched.lower import cpu_schedule
    except ImportError:
        return None
    except Exception as err:  # noqa: BLE001  (a broken module must not stop tuning)
        log.warning("tvmsched.lower.cpu_schedule does not import (%s): tuning starts without the default schedule", one_line(err))
        return None
    schedule = getattr(cpu_schedule, "schedule", None)
    return schedule if callable(schedule) else None


def _trace_key(trace) -> str:
    return str(trace.as_json(remove_postproc=True))


def default_trace(func, target, schedule_fn):
    """(trace, the PrimFunc it schedules) of `schedule_fn(func, target)` if the trace replays on the task module
    (where MetaSchedule will replay it), else None (no schedule, an empty one, or one made on another module)."""
    if schedule_fn is None:
        return None
    try:
        sch = schedule_fn(func, target)
        trace = None if sch is None else sch.trace
        if trace is None or len(trace.insts) == 0:
            return None
        return trace, replay(func, trace)
    except Exception as err:  # noqa: BLE001  (no seed is better than no tuning)
        log.info("the default schedule cannot seed tuning: %s", one_line(err))
        return None


def replay(func, trace):
    """`func` scheduled by `trace` (a tuning record's or a default schedule's), as a PrimFunc."""
    from tvm.s_tir.schedule import Schedule

    sch = Schedule(task_module(func))
    trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod["main"]


def ms_run_secs(builder, runner, func, target) -> list[float] | None:
    """Run times of a scheduled PrimFunc measured as MetaSchedule measures its candidates (its builder
    and runner), so that a seeded record ranks fairly among the search's; None if that fails."""
    import tvm
    import tvm.s_tir.meta_schedule as ms

    try:
        mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
        built = builder.build([ms.builder.BuilderInput(mod, target)])[0]
        if built.error_msg:
            raise RuntimeError(built.error_msg)
        args_info = ms.arg_info.ArgInfo.from_prim_func(func)
        result = runner.run([ms.runner.RunnerInput(built.artifact_path, describe(target).device, args_info)])[0].result()
        if result.error_msg:
            raise RuntimeError(result.error_msg)
        return [float(secs) for secs in result.run_secs]
    except Exception as err:  # noqa: BLE001
        log.info("measuring the default schedule with MetaSchedule's runner failed: %s", one_line(err))
        return None


def seed_default_record(database, func, target, trace, run_secs: list[float]) -> bool:
    """Commit the default schedule (its trace, its measured run times) as a tuning record of the workload:
    MetaSchedule's evolutionary search takes the workload's best records from the database into its first
    population (EvolutionarySearch: PickBestFromDatabase, init_measured_ratio of the population), so the
    search starts from the default schedule and mutates it along with its random samples."""
    import tvm.s_tir.meta_schedule as ms

    try:
        mod = task_module(func)
        workload = database.commit_workload(mod)
        args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
        database.commit_tuning_record(ms.database.TuningRecord(trace, workload, run_secs, target, args_info))
        return True
    except TvmschedError:
        raise
    except Exception as err:  # noqa: BLE001
        log.warning("could not seed tuning with the default schedule: %s", one_line(err))
        return False


def best_search_record(database, func, target, seed_key: str | None, k: int = 16):
    """The workload's fastest record that is not the seeded default schedule (None if there is none)."""
    mod = task_module(func)
    best = database.query_tuning_record(mod, target, "main")
    if best is None or seed_key is None or _trace_key(best.trace) != seed_key:
        return best
    return next((r for r in database.get_top_k(database.commit_workload(mod), k) if _trace_key(r.trace) != seed_key), None)


def tune_model(
    funcs: dict[str, object],
    target,
    database,
    *,
    trials: int = 0,
    minutes: float | None = None,
    layer_counts: dict[str, int] | None = None,
    defaults: dict[str, object],
    measure=None,
    seed_schedule=None,
    runner=None,
    progress: bool = True,
    work_dir: str | None = None,
    records_only: bool = False,
) -> TuningRun:
    """Tune a model's PrimFuncs: each distinct workload once, within a trial count or a time budget,
    starting from and never ending slower than the default schedule.

    Args:
        funcs: PrimFunc name -> unscheduled PrimFunc (model order).
        trials: trials per workload (`minutes` unset), or each workload's cap (with `minutes`; 0: no cap).
        minutes: a budget for this whole stage: split across the workloads not yet in the database by
            their share of the model's default latency (layers x measured latency; estimated FLOPs where
            nothing can be measured here), turned into trials at the rate measured so far (recomputed after
            every workload), at least MIN_TRIALS each, heaviest first; the search stops at the deadline
            (the iteration in flight, at most BUDGET_TRIALS_PER_ITER trials, finishes first).
        layer_counts: model layers calling each PrimFunc (weights the budget; default 1).
        defaults: PrimFunc name -> default-scheduled PrimFunc (kernels.default_schedule), the floor.
        measure: `measure(name, func) -> microseconds` of a scheduled PrimFunc of `name`'s shapes (optionally
            with `measure.many({name: func}) -> {name: us}` and `measure.pair(name, a, b) -> (us, us)`, timed side
            by side), or None where kernels cannot be measured here (then the tuned kernel is kept unmeasured).
        seed_schedule: `f(func, target) -> tvm.s_tir.Schedule | None`, the default schedule to seed each
            search with (`default_seed_schedule(target)`); None: no seeding.
        work_dir: keep MetaSchedule's logs under work_dir/<workload>/ (default: temporary).
        records_only: search nothing: the workloads with a record in the database are decided as above,
            the others keep the default schedule (status "skipped"); `trials` and `minutes` are unused.
    """
    if records_only:
        trials, minutes = 0, None
    elif minutes is None and trials <= 0:
        raise TvmschedError("tuning needs --tune-trials > 0 or --tune-minutes")
    tuning = _ModelTuning(funcs, target, database, trials=trials, minutes=minutes, layer_counts=layer_counts,
                          defaults=defaults, measure=measure, seed_schedule=seed_schedule)
    tuning.plan(records_only, runner)
    tuning.search(runner, progress, work_dir)
    return tuning.result()


class _ModelTuning:
    """tune_model's steps: plan (workloads, seeds, what the database holds, the budget's split), search (each
    pending workload in turn, within its share), result (the chosen schedules and the report)."""

    def __init__(self, funcs, target, database, *, trials, minutes, layer_counts, defaults, measure, seed_schedule):
        self.funcs, self.target, self.database = funcs, target, database
        self.trials, self.minutes, self.defaults, self.measure = trials, minutes, defaults, measure
        self.start = time.monotonic()
        self.deadline = None if minutes is None else self.start + minutes * 60.0
        self.groups = group_workloads(funcs, layer_counts)
        self.measured: dict[str, float | None] = {}
        self.seeds = {w.name: default_trace(w.func, target, seed_schedule) for w in self.groups}
        self.seed_keys = {name: None if seed is None else _trace_key(seed[0]) for name, seed in self.seeds.items()}
        self.outcomes: dict[str, LayerTuning] = {}
        self.chosen: dict[str, object] = {}  # workload -> trace of the tuned kernel it runs
        self.totals = {"trials": 0, "seconds": 0.0, "seeded": 0}
        self.deadline_hit = False

    def default_us(self, w: Workload) -> float | None:
        if w.name not in self.measured:
            self.measured[w.name] = _measured(self.measure, w.name, self.defaults[w.name])
        return self.measured[w.name]

    def plan(self, records_only: bool, runner) -> None:
        """Which workloads the database decides (cached), which are searched (pending, heaviest first with a
        budget) and which keep the default (unsearched: records only)."""
        groups, target = self.groups, self.target
        self.cached = {w.name for w in groups
                       if best_search_record(self.database, w.func, target, self.seed_keys[w.name]) is not None}
        self.weights = {w.name: float(w.layers) for w in groups}  # the budget's split (by latency, with a budget)
        self.pending, self.unsearched = [w for w in groups if w.name not in self.cached], []
        if records_only:
            self.pending, self.unsearched = [], self.pending
        if self.pending and runner is None:  # MetaSchedule's LocalRunner measures here: the device must exist
            require_local_device(target)
        if self.minutes is not None and self.pending:  # the split needs their latency first; heaviest first
            if hasattr(self.measure, "many"):  # one build for all of them
                try:
                    self.measured.update(self.measure.many({w.name: self.defaults[w.name] for w in self.pending}))
                except Exception as err:  # noqa: BLE001  (then one by one)
                    log.info("measuring the default schedules together failed (%s): one by one", one_line(err))
            costs = {w.name: self.default_us(w) for w in self.pending}
            if not all(costs.values()):
                costs = {w.name: kernels.estimated_flops(w.func) or 1.0 for w in self.pending}
            self.weights = {w.name: w.layers * costs[w.name] for w in self.pending}
            self.pending.sort(key=lambda w: -self.weights[w.name])

    def search(self, runner, progress: bool, work_dir: str | None) -> None:
        from tqdm import tqdm

        bar = tqdm(total=len(self.groups), desc="tuning", unit="workload", disable=not progress, file=sys.stderr)
        workers = _SharedWorkers(runner)
        report = functools.partial(_report_progress, bar, progress=progress)
        with bar, tensor_intrinsics(self.target), _interruptible() as interrupted, \
                contextlib.closing(workers):
            for w in [w for w in self.groups if w.name in self.cached]:
                self.decide(w, LayerTuning(w.name, "cached", 0, 0.0))
                report(w, self.outcomes[w.name])
            for w in self.unsearched:
                self.outcomes[w.name] = LayerTuning(w.name, "skipped", 0, 0.0, "no tuned record in the database",
                                                    kernel="default")
                report(w, self.outcomes[w.name])
            for index, w in enumerate(self.pending):
                share = self.share(index, w)
                if share is None:  # the deadline came first: the rest keep their default schedules
                    for rest in self.pending[index:]:
                        self.outcomes[rest.name] = LayerTuning(
                            rest.name, "skipped", 0, 0.0, "the --tune-minutes deadline came first",
                            default_us=self.measured.get(rest.name), kernel="default")
                        report(rest, self.outcomes[rest.name])
                    break
                bar.set_postfix_str(f"{w.name[:32]} x{w.layers}, {share[0]} trials")
                self.search_one(w, *share, workers, interrupted, work_dir)
                report(w, self.outcomes[w.name])
                if interrupted.is_set():  # Ctrl-C during that workload: stop here (its records are saved)
                    raise KeyboardInterrupt

    def share(self, index: int, w: Workload) -> tuple[int, float | None] | None:
        """(trials, time to stop at) of pending workload `index`; None when the deadline leaves it no time."""
        if self.deadline is None:
            return self.trials, None
        now = time.monotonic()
        left = self.deadline - now
        totals = self.totals
        rate = totals["trials"] / totals["seconds"] if totals["trials"] >= MIN_TRIALS else PRIOR_TRIALS_PER_MINUTE / 60
        if left <= 0 or (totals["trials"] >= MIN_TRIALS and left < MIN_TRIALS / rate / 2):
            self.deadline_hit = True
            return None
        rest = sum(self.weights[p.name] for p in self.pending[index:])
        planned, seconds = budget_share(left, self.weights[w.name], rest, rate, self.trials)
        return planned, now + seconds * OVERRUN

    def search_one(self, w: Workload, planned: int, stop_at, workers, interrupted, work_dir) -> None:
        """Seed the search with the default schedule's record, search within the share, decide."""
        target, database = self.target, self.database
        seeded = False
        if self.seeds[w.name] is not None:
            trace, seeded_func = self.seeds[w.name]
            run_secs = ms_run_secs(workers.builder(), workers.runner(), seeded_func, target)
            if run_secs is None and self.default_us(w) is not None:
                run_secs = [self.default_us(w) * 1e-6]
            seeded = run_secs is not None and seed_default_record(database, w.func, target, trace, run_secs)
        self.totals["seeded"] += seeded
        stopper = None
        if self.deadline is not None:
            stopper = _Stopper(self.deadline, stop_at, min(planned, BUDGET_TRIALS_PER_ITER), interrupted)
        folder = None if work_dir is None else os.path.join(work_dir, w.name)
        per_iter = BUDGET_TRIALS_PER_ITER if self.deadline is not None else 64
        outcome = _tune_one(w.name, w.func, target, database, planned, workers.runner(), workers.builder(),
                            per_iter=per_iter, stopper=stopper, work_dir=folder)
        self.totals["trials"] += outcome.trials  # counted after the seed was committed
        self.totals["seconds"] += outcome.seconds
        message = outcome.message
        if stopper is not None and stopper.stopped_by:
            self.deadline_hit |= stopper.stopped_by == "deadline"
            reason = {"deadline": "the model's deadline", "share": "the end of its time share", "interrupt": "Ctrl-C"}
            message = message or f"search stopped at {reason[stopper.stopped_by]}"
        self.decide(w, dataclasses.replace(outcome, message=message, seeded=bool(seeded), planned_trials=planned))

    def decide(self, w: Workload, outcome: LayerTuning) -> None:
        self.outcomes[w.name], self.chosen[w.name] = _decide(
            w, outcome, self.database, self.target, self.default_us, self.measure, self.seed_keys[w.name], self.defaults)

    def result(self) -> TuningRun:
        """Each layer's schedule (the tuned ones replayed on every member of a workload) and the report."""
        scheduled, report = {}, []
        for w in self.groups:
            outcome = self.outcomes[w.name]
            for member in w.members:
                shared = outcome if member == w.name else dataclasses.replace(
                    outcome, func=member, trials=0, seconds=0.0, seeded=False)
                report.append(dataclasses.replace(shared, workload=w.name, layers=w.layers))
                if outcome.kernel == "tuned":
                    scheduled[member] = replay(self.funcs[member], self.chosen[w.name])
        order = {name: i for i, name in enumerate(self.funcs)}
        report.sort(key=lambda r: order[r.func])
        totals = self.totals
        return TuningRun(
            scheduled, report, len(self.groups), sum(w.layers for w in self.groups), totals["trials"],
            totals["seconds"], time.monotonic() - self.start, self.minutes, self.deadline_hit, totals["seeded"],
        )


class _SharedWorkers:
    """One pooled builder and (unless given) one local runner for all the workloads of a model, started
    when first needed (a model whose workloads are all in the database starts no worker)."""

    def __init__(self, runner) -> None:
        self.given_runner, self._builder, self._runner = runner, None, None

    def builder(self):
        if self._builder is None:
            self._builder = pooled_builder()
        return self._builder

    def runner(self):
        if self.given_runner is not None:
            return self.given_runner
        if self._runner is None:
            self._runner = local_runner()
        return self._runner

    def close(self) -> None:
        if self._builder is not None:
            self._builder.close()
        pool = getattr(self._runner, "pool", None)
        if pool is not None:
            pool.shutdown()


def _measured(measure, name: str, func) -> float | None:
    if measure is None:
        return None
    try:
        return float(measure(name, func))
    except Exception as err:  # noqa: BLE001  (an unmeasurable kernel is reported, not fatal)
        log.warning("could not measure %s: %s", name, one_line(err))
        return None


def _decide(w: Workload, outcome: LayerTuning, database, target, default_us, measure, seed_key, defaults) -> tuple[LayerTuning, object]:
    """Keep the faster of the best record the search found and the default schedule (`defaults[w.name]`), both
    measured here alike and, where `measure.pair` can, side by side in one build (the seeded record's time came
    from MetaSchedule's runner: not compared with ours). `default_us(w)`: the default's latency measured alone
    (cached; used where there is no pair to time).
    Returns the outcome and the trace of the tuned kernel to run (None: the default)."""
    if outcome.status in ("fallback", "skipped"):
        return dataclasses.replace(outcome, default_us=default_us(w), kernel="default"), None
    kept = "cached" if outcome.status == "cached" else "default-kept"
    record = best_search_record(database, w.func, target, seed_key)
    if record is None:
        if outcome.seeded or (seed_key is not None and database.query_tuning_record(task_module(w.func), target, "main")):
            message = outcome.message or "the search found no valid schedule besides the default"
            return dataclasses.replace(outcome, status=kept, message=message, default_us=default_us(w), kernel="default"), None
        message = outcome.message or "no valid record"
        return dataclasses.replace(outcome, status="fallback", message=message, default_us=default_us(w), kernel="default"), None
    try:
        tuned = replay(w.func, record.trace)
        if _signature(tuned) != _signature(w.func):  # the layer's tensors would not fit it
            raise ValueError("it changes the kernel's parameters")
    except Exception as err:  # noqa: BLE001  (a record that no longer replays)
        log.warning("the best record of %s cannot be used: %s", w.name, one_line(err))
        return dataclasses.replace(outcome, status="fallback", message=f"the best record cannot be used: {one_line(err)[:150]}",
                                   default_us=default_us(w), kernel="default"), None
    if measure is None and w.name in defaults and _loses_tensor_cores(w.func, defaults[w.name], tuned):
        message = "the default schedule runs on tensor cores, the record's kernel does not (not measured against it here)"
        return dataclasses.replace(outcome, status=kept, message=message, kernel="default"), None
    base_us = tuned_us = None
    if hasattr(measure, "pair"):  # the two timed together, not minutes apart
        try:
            base_us, tuned_us = measure.pair(w.name, defaults[w.name], tuned)
        except Exception as err:  # noqa: BLE001  (one of the two does not build or run: each alone)
            log.info("timing %s's default and tuned kernels together failed (%s): each alone", w.name, one_line(err))
    if tuned_us is None:
        base_us, tuned_us = default_us(w), _measured(measure, w.name, tuned)
    if measure is not None and tuned_us is None:
        return dataclasses.replace(outcome, status="fallback", message="the tuned kernel could not be measured",
                                   default_us=base_us, kernel="default"), None
    if base_us is not None and tuned_us is not None and base_us <= tuned_us:
        message = f"default {base_us:.4g} us <= tuned {tuned_us:.4g} us"
        message = f"{outcome.message}; {message}" if outcome.message else message
        return dataclasses.replace(outcome, status=kept, default_us=base_us, tuned_us=tuned_us, kernel="default",
                                   message=message), None
    return dataclasses.replace(outcome, default_us=base_us, tuned_us=tuned_us, kernel="tuned"), record.trace


def _loses_tensor_cores(func, default, tuned) -> bool:
    """A record's kernel that would replace a default schedule on tensor cores with SIMT code. Where the two cannot be
    timed against each other (a GPU this machine lacks), the default is kept: a record's time was measured against
    the other samples of its round, never against the tensor-core default."""
    from tvmsched.lower import gpu_schedule
    from tvmsched.lower.kernels import gpu_path

    return (gpu_path(func, default)[0] == gpu_schedule.TENSOR_CORES
            and gpu_path(func, tuned)[0] != gpu_schedule.TENSOR_CORES)


def _signature(func) -> list[tuple[str, str]]:
    """(shape, dtype) of each parameter, as text."""
    sig = []
    for param in func.params:
        ty = getattr(param, "ty", None)
        sig.append((str(getattr(ty, "shape", "")), str(getattr(ty, "dtype", getattr(param, "dtype", "")))))
    return sig


def _report_progress(bar, w: Workload, outcome: LayerTuning, progress: bool) -> None:
    bar.update(1)
    if not progress:
        return
    timing = ""
    if outcome.default_us is not None:
        timing = f", default {outcome.default_us:.4g} us" + (f", tuned {outcome.tuned_us:.4g} us" if outcome.tuned_us is not None else "")
    bar.write(f"  {w.name} (x{w.layers}): {outcome.status}, {outcome.trials} trials, {outcome.seconds:.1f} s{timing}; "
              f"runs the {outcome.kernel or 'default'} kernel", file=sys.stderr)


def space_generator(target):
    """MetaSchedule's design space for `target`. On CPUs its generic llvm rules: for an "mcpu" with AVX-512 or
    VNNI, MetaSchedule would pick its x86 int8 dot-product rules, which need the tensor intrinsics (the 30 s
    `tvm.s_tir.tensor_intrin` import this module skips: "TensorIntrin 'dot_16x4_vnni' is not registered")
    and do nothing for float layers."""
    if not describe(target).cpu:
        return "post-order-apply"
    import tvm.s_tir.meta_schedule as ms

    return ms.space_generator.PostOrderApply(sch_rules="llvm", postprocs="llvm", mutator_probs="llvm")


def search_strategy(trials: int):
    """Evolutionary search with a population scaled to the budget (512 costs ~5 s/iteration on 2 cores)."""
    import tvm.s_tir.meta_schedule as ms

    return ms.search_strategy.EvolutionarySearch(population_size=min(512, max(32, 8 * trials)))


def cost_model(num_cores: int):
    """MetaSchedule's XGB cost model (as `tune_tir` makes it), trained only once its predictions are used.

    XGBModel predicts at random until it holds `num_warmup_samples` (100) measured candidates, yet it re-trains
    after every measured batch from the first: each such training (xgboost plus its Python evaluation callback)
    costs about a second on 2 cores and its model is never used, and a search of fewer than 100 trials trains only
    such models. This one keeps every measurement and trains when its model is about to be used (then as
    XGBModel does: again whenever the data grew by a fifth)."""
    return _warm_xgb_class()(num_tuning_cores=num_cores, tree_method="auto")


@functools.cache
def _warm_xgb_class():
    import tvm.s_tir.meta_schedule as ms
    from tvm.ir.utils import derived_object

    @derived_object
    class WarmXGB(ms.cost_model.XGBModel._cls):
        def _train(self, xs, ys) -> None:
            if self.data_size < self.num_warmup_samples:
                self.last_train_size = 0  # the first training once warm is not skipped by the adaptive rule
                return
            super()._train(xs, ys)

    return WarmXGB


def _tune_one(
    name: str, func, target, database, trials: int, runner, builder, *, per_iter: int = 64,
    stopper: "_Stopper | None" = None, work_dir: str | None = None,
) -> LayerTuning:
    """Search `func`'s schedules (the caller has checked that the database has no record of it yet)."""
    import tvm.s_tir.meta_schedule as ms

    mod = task_module(func)
    before, start = len(database), time.perf_counter()
    strategy = search_strategy(trials) if stopper is None else _deadline_search(search_strategy(trials), stopper)
    try:
        with _work_dir(work_dir) as folder, _ms_console_quieted(), ms_logging_isolated():
            ms.tune_tir(
                mod, target, folder, max_trials_global=trials, num_trials_per_iter=min(trials, per_iter),
                builder=builder, runner=runner, database=database, strategy=strategy,
                space=space_generator(target), cost_model=cost_model(ms.utils.cpu_count(logical=False)),
            )
    except TvmschedError:  # the database refused or is unreachable: the user must act
        raise
    except Exception as err:  # tuning failures fall back to the default schedule, reported
        log.warning("layer %s: tuning failed: %s", name, err)
        return LayerTuning(name, "fallback", len(database) - before, time.perf_counter() - start, one_line(err)[:200])
    return LayerTuning(name, "tuned", len(database) - before, time.perf_counter() - start)


@contextlib.contextmanager
def _interruptible():
    """Record Ctrl-C (SIGINT) during tuning so the caller stops after the layer being tuned.

    The handler only sets a flag: a KeyboardInterrupt raised wherever the signal lands can be inside a
    Python callback that TVM's C++ called, and unwinding through it there ended in std::terminate
    (SIGSEGV, about one interrupt in four). A second Ctrl-C quits at once.
    """
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def on_sigint(signum, frame):
        if interrupted.is_set():
            sys.stderr.write("\ninterrupted\n")
            sys.stderr.flush()
            os._exit(130)  # as the CLI exits on an interrupt (no TVM worker-pool destructors)
        interrupted.set()
        sys.stderr.write("\ninterrupting: stopping after the layer being tuned (Ctrl-C again to quit now)\n")

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield interrupted
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _ms_console_quieted():
    """MetaSchedule prints its progress tables to stdout: drop them unless our log shows INFO (-v)."""
    if log.isEnabledFor(logging.INFO):
        yield
        return
    with contextlib.redirect_stdout(_DISCARD):
        yield


@contextlib.contextmanager
def ms_logging_isolated():
    """Run MetaSchedule with its loggers as it needs them, and leave the process's logging as it found it.

    On entry its non-propagating `tvm.s_tir.meta_schedule` logger loses its unnamed handlers (pytest's, a host
    application's): `create_loggers` lists that logger's handler names, and a second tune in one process fails with
    "'NoneType' object has no attribute 'format'" on an unnamed one. On exit the console handler and the per-task file
    handlers (open on the work folder's logs) that it adds are removed and closed, levels and propagation are restored,
    and the unnamed handlers come back (`tvmsched` called in process leaves no handler added or removed)."""
    prefix = "tvm.s_tir.meta_schedule"

    def ours() -> dict[str, logging.Logger]:
        names = [name for name in list(logging.root.manager.loggerDict) if name == prefix or name.startswith(prefix + ".")]
        return {name: logging.getLogger(name) for name in names}

    before = {name: (list(logger.handlers), logger.level, logger.propagate) for name, logger in ours().items()}
    main = logging.getLogger(prefix)
    unnamed = [handler for handler in main.handlers if handler.get_name() is None]
    for handler in unnamed:
        main.removeHandler(handler)
    try:
        yield
    finally:
        for name, logger in ours().items():
            handlers, level, propagate = before.get(name, ([], logging.NOTSET, True))
            for handler in [h for h in logger.handlers if h not in handlers]:
                logger.removeHandler(handler)
                handler.close()
            logger.setLevel(level)
            logger.propagate = propagate
        for handler in unnamed:
            main.addHandler(handler)


class _Discard(io.TextIOBase):
    """A text stream that drops everything (stays usable by handlers bound to it)."""

    def write(self, text: str) -> int:
        return len(text)


_DISCARD = _Discard()


@contextlib.contextmanager
def tensor_intrinsics(target):
    """Make `tvm.s_tir.tensor_intrin`, which MetaSchedule's TuneContext imports, cheap to import for `target`.

    On llvm, an empty stand-in module for the duration (fp32 CPU rules use no tensor intrinsic). Elsewhere the real
    module, imported with inspect's module lookup memoized (`inspect_getmodule_memoized`): ~7 s instead of 45-130 s.
    """
    key = "tvm.s_tir.tensor_intrin"
    if key in sys.modules:
        yield
        return
    if not describe(target).cpu:
        load_tensor_intrinsics()
        yield
        return
    sys.modules[key] = types.ModuleType(key)
    try:
        yield
    finally:
        sys.modules.pop(key, None)


def sample_schedules(func, target, count: int, *, seed: int = 0, attempts_per_sample: int = 64) -> list:
    """Up to `count` distinct random schedules of `func` from MetaSchedule's design space.

    What MetaSchedule's replay-trace search does: each design space's trace is replayed with its
    sampling decisions dropped (so they are drawn anew), then the target's postprocessors must
    accept it (on CUDA they reject schedules that break shared memory or thread limits).
    Used where candidates are built here and measured on another machine (`tvmsched.tune.kit_build`).
    """
    import tvm.s_tir.meta_schedule as ms
    from tvm.s_tir.schedule import Schedule, Trace

    mod = task_module(func)
    with tensor_intrinsics(target):
        context = ms.TuneContext(mod=mod, target=target, space_generator=space_generator(target), task_name="main")
        spaces = context.space_generator.generate_design_space(mod)
        postprocs = context.space_generator.postprocs
    found: dict[str, object] = {}
    seeds = random.Random(seed)  # spread seeds: TVM's engine draws alike from consecutive ones
    for attempt in range(max(256, count * attempts_per_sample)):
        if len(found) >= count:
            break
        trace = spaces[attempt % len(spaces)].trace
        sch = Schedule(mod, seed=seeds.randrange(1, 2**31 - 1))
        try:
            Trace(trace.insts, {}).apply_to_schedule(sch, remove_postproc=True)
            sch.enter_postproc()  # marks what follows as postprocessing, as MetaSchedule's records do (see `replays_as_seed`)
            if not all(proc.apply(sch) for proc in postprocs):
                continue
        except Exception:  # noqa: BLE001  (an invalid sample is skipped, as MetaSchedule does)
            continue
        found.setdefault(str(sch.trace.as_json()), sch)
    return list(found.values())


# ---- rounds of build-here / measure-there tuning (tvmsched.tune.kit_build) -------------------------------------

ROUND_TRAIN_RECORDS = 4096  # at most this many measured records per workload train the cost model
ROUND_SEARCH_ITERS = 4  # search iterations per workload and round (each gives up to `count` new candidates)


@dataclass
class SeededSample:
    """Schedules a search round drew for one workload, and what the database gave it."""

    schedules: list  # tvm.s_tir.Schedule, none of them equal to a measured record's
    records: int  # measured records of the workload in the database's scope
    best_us: float | None  # the fastest of them
    population_seeds: list[dict]  # {"trace": trace key digest, "us": ...} of the records the search took as its first population


class SeededSearch:
    """MetaSchedule's evolutionary search seeded from a database's measured records, for kits built here and
    measured on another machine (several short rounds instead of one live tuning session).

    One XGB cost model (MetaSchedule's) is trained on the measured records of all the workloads given to `learn`;
    each workload's search then starts from its database's top records (EvolutionarySearch: PickBestFromDatabase,
    `init_measured_ratio` of the population) plus random samples, evolves them by the cost model's predictions, and
    returns the picks (mostly the predicted best, `eps_greedy` of them random) that no measured record equals.
    Nothing is committed to the database: the kit's samples become records only when measured and imported."""

    def __init__(self, target, database, *, measured_ratio: float = 0.2) -> None:
        """measured_ratio: the share of the search's first population taken from the database's top records
        (EvolutionarySearch's init_measured_ratio; MetaSchedule's default 0.2)."""
        import tvm.s_tir.meta_schedule as ms

        self.target, self.database, self.measured_ratio = target, database, measured_ratio
        self.cost_model = ms.cost_model.XGBModel(num_warmup_samples=1, verbose_eval=10**9, num_tuning_cores=os.cpu_count())
        self._records: dict[int, list] = {}  # id(func) -> measured records, fastest first

    def records(self, func) -> list:
        """The workload's measured records (fastest first, at most ROUND_TRAIN_RECORDS) in the database's scope."""
        key = id(func)
        if key not in self._records:
            mod = task_module(func)
            found = []
            if self.database.has_workload(mod):
                found = self.database.get_top_k(self.database.commit_workload(mod), ROUND_TRAIN_RECORDS)
            self._records[key] = [r for r in found if r.run_secs and all(float(s) > 0 for s in r.run_secs)]
        return self._records[key]

    def learn(self, func) -> int:
        """Train the cost model on the workload's measured records; returns how many."""
        import tvm.s_tir.meta_schedule as ms

        records = self.records(func)
        if records:
            with self._context(func, None) as context:
                candidates = [r.as_measure_candidate() for r in records]
                self.cost_model.update(context, candidates, [ms.runner.RunnerResult(r.run_secs, None) for r in records])
        return len(records)

    def sample(self, func, count: int, *, seed: int = 0) -> SeededSample:
        """Up to `count` schedules of `func` from a search seeded with its measured records."""
        import tvm.s_tir.meta_schedule as ms
        import tvm_ffi

        records = self.records(func)
        measured = {tvm_ffi.structural_hash(r.as_measure_candidate().sch.mod) for r in records}
        population = min(512, max(64, 16 * count))
        strategy = ms.search_strategy.EvolutionarySearch(
            population_size=population, init_measured_ratio=self.measured_ratio, init_min_unmeasured=min(50, population // 2))
        found: dict[int, object] = {}
        with self._context(func, strategy, seed) as context:
            design_spaces = context.space_generator.generate_design_space(context.mod)
            postprocs = context.space_generator.postprocs
            watch = _seed_watch(self.database, [r for r in records if replays_as_seed(context.mod, r.trace, postprocs)])
            # the search's picks may repeat its measured seeds (it knows only what it picked itself as measured):
            # ask for that many more, so that one iteration usually yields `count` new schedules
            per_iter = count + min(len(watch.seedable), int(population * self.measured_ratio))
            context.pre_tuning(per_iter * ROUND_SEARCH_ITERS, per_iter, design_spaces, watch, self.cost_model)
            try:
                for _ in range(ROUND_SEARCH_ITERS):
                    candidates = context.generate_measure_candidates()
                    if not candidates:
                        break
                    for candidate in candidates:
                        key = tvm_ffi.structural_hash(candidate.sch.mod)
                        if key not in measured and len(found) < count:
                            found.setdefault(key, candidate.sch)
                    if len(found) >= count:
                        break
                    # advances the search (nothing is measured here; nothing reaches the cost model or database)
                    unmeasured = ms.runner.RunnerResult(None, "measured on the device later")
                    context.notify_runner_results(candidates, [unmeasured] * len(candidates))
            finally:
                context.post_tuning()
        best = min((float(sum(r.run_secs) / len(r.run_secs)) for r in records), default=None)
        return SeededSample(list(found.values()), len(records), None if best is None else best * 1e6, watch.seeds)

    @contextlib.contextmanager
    def _context(self, func, strategy, seed: int = 0):
        import tvm.s_tir.meta_schedule as ms

        with tensor_intrinsics(self.target), _ms_console_quieted(), ms_logging_isolated():
            yield ms.TuneContext(mod=task_module(func), target=self.target, space_generator=space_generator(self.target),
                                 search_strategy=strategy, task_name="main", rand_state=seed + 1)


def replays_as_seed(mod, trace, postprocs) -> bool:
    """Whether MetaSchedule's search can take a record's trace into its population: replayed without its
    postprocessing steps, then postprocessed anew (EvolutionarySearch's PickBestFromDatabase). A trace whose
    postprocessing steps are not marked as such (kits sampled before 2026-11-26 recorded them as schedule steps)
    fails that replay inside the search's worker threads, which ends the whole search with "Check failed:
    old_outputs.size() == new_outputs.size()"."""
    from tvm.s_tir.schedule import Schedule

    if not any(inst.kind.name == "EnterPostproc" for inst in trace.insts):
        return False
    try:
        sch = Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        return all(proc.apply(sch) for proc in postprocs)
    except Exception:  # noqa: BLE001
        return False


def trace_digest(trace) -> str:
    """A short key of a trace (a Trace, or its JSON as kits store it): the same for a kit's sample and the
    database record made of it."""
    import hashlib
    import json

    text = json.dumps(plain_json(trace.as_json() if hasattr(trace, "as_json") else trace))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def plain_json(obj):
    """JSON-able Python values of a (possibly partly) TVM-container JSON object."""
    from tvm.s_tir.meta_schedule.utils import _json_de_tvm

    if isinstance(obj, (list, tuple)):
        return [plain_json(item) for item in obj]
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    return _json_de_tvm(obj)


_SEED_WATCH = None


def _seed_watch(database, seedable: list):
    """`database` for one workload's search, read-only: its top records are `seedable` (the workload's records
    that replay as seeds, fastest first), and the ones the search takes are noted in `.seeds`."""
    global _SEED_WATCH
    if _SEED_WATCH is None:
        from tvm.ir.utils import derived_object
        from tvm.s_tir.meta_schedule.database import PyDatabase

        @derived_object
        class SeedWatch(PyDatabase):
            def __init__(self, inner, seedable):
                super().__init__()
                self.inner, self.seedable, self.seeds = inner, seedable, []

            def has_workload(self, mod):
                return self.inner.has_workload(mod)

            def commit_workload(self, mod):
                return self.inner.commit_workload(mod)

            def commit_tuning_record(self, record):
                raise TvmschedError("a search round commits no record: only measured ones are imported")

            def get_top_k(self, workload, top_k):
                top = self.seedable[:max(0, top_k)]
                self.seeds.extend({"trace": trace_digest(r.trace), "us": float(sum(r.run_secs) / len(r.run_secs)) * 1e6}
                                  for r in top if r.run_secs)
                return top

            def get_all_tuning_records(self):
                return self.inner.get_all_tuning_records()

            def query_tuning_record(self, mod, target, workload_name):
                return self.inner.query_tuning_record(mod, target, workload_name)

            def query_schedule(self, mod, target, workload_name):
                return self.inner.query_schedule(mod, target, workload_name)

            def query_ir_module(self, mod, target, workload_name):
                return self.inner.query_ir_module(mod, target, workload_name)

            def __len__(self):
                return len(self.inner)

        _SEED_WATCH = SeedWatch
    return _SEED_WATCH(database, seedable)


# ---- where tuning trials are measured ---------------------------------------------------------------------------


def device_kind(target) -> str:
    """The device kind that runs a target's trials: the engine's ("cpu", "cuda"), else TVM's name of the kind."""
    info = describe(target)
    return info.device if info.cpu or info.gpu else info.kind


def local_device_present(kind: str) -> bool:
    """Whether this machine has device 0 of `kind` (CPUs always; CUDA: a driver and a GPU)."""
    if kind == "cpu":
        return True
    import tvm

    try:
        return bool(tvm.device(kind, 0).exist)
    except Exception:  # noqa: BLE001  (a runtime without that device kind)
        return False


def measurement_runner(target, rpc: str | None = None, *, device_present: bool | None = None):
    """The MetaSchedule runner that measures tuning trials for `target`: an RPCRunner when `rpc` names a
    tracker, else MetaSchedule's LocalRunner on this machine's device of the target's kind (MetaSchedule runs each
    candidate on `tvm.device(target.kind.name, 0)`: a CUDA target's on GPU 0). `device_present`: whether that
    device exists (default: asked of TVM); without one, a user error that names the other ways to tune."""
    if rpc:
        return rpc_runner(rpc)
    require_local_device(target, device_present)
    return local_runner()


def require_local_device(target, device_present: bool | None = None) -> str:
    """The device kind that measures `target`'s trials on this machine (see `measurement_runner`); a user error
    where this machine has none (`device_present`: default asked of TVM)."""
    kind = device_kind(target)
    if device_present is None:
        device_present = local_device_present(kind)
    if not device_present:
        raise TvmschedError(
            f"tuning for {describe(target).kind} measures its trials on a {kind} device and this machine has none: "
            f"tune on the GPU machine itself, measure over RPC (--rpc HOST:PORT:KEY), or build kits here and "
            f"measure them there in rounds (tvmsched tune kit / tune measure / tune import, then compile --db; "
            f"see docs/tuning-gpu.md)"
        )
    return kind
