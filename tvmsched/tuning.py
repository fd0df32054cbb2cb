"""Stage 4a: tune each layer with MetaSchedule into a tuning database, then read the best schedules.

Uses the builder fix from ../shared/tvm-notes.md: candidates are built by a function that does not
import `tvm.s_tir.tensor_intrin` (a 25-35 s import that times out the default builder's workers).
"""

from __future__ import annotations

import contextlib
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

from tvmsched.errors import TvmschedError, one_line

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
    """What tuning did for one PrimFunc."""

    func: str
    status: str  # "tuned" | "cached" (records already in the database) | "fallback" (no valid record)
    trials: int  # new records committed by this run
    seconds: float
    message: str = ""


def build_candidate(mod, target, _params=None):
    """MetaSchedule builder function (runs in builder workers); skips the tensor-intrinsic import."""
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    with target:
        return build(mod, target=target)


def make_builder(timeout_s: int = BUILD_TIMEOUT_S, max_workers: int | None = None):
    import tvm.s_tir.meta_schedule as ms

    return ms.builder.LocalBuilder(f_build=build_candidate, timeout_sec=timeout_s, max_workers=max_workers)


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
    config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=key, session_timeout_sec=session_timeout_s)
    return ms.runner.RPCRunner(rpc_config=config)


def local_runner(initializer=None):
    """MetaSchedule's LocalRunner with a generous timeout; `initializer` runs in its worker."""
    import tvm.s_tir.meta_schedule as ms

    return ms.runner.LocalRunner(timeout_sec=RUN_TIMEOUT_S, initializer=initializer)


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

    Returns:
        ({name: scheduled PrimFunc} for the layers with a valid record, one LayerTuning per func).
    """
    from tqdm import tqdm

    scheduled, report = {}, []
    bar = tqdm(funcs.items(), total=len(funcs), desc=desc, unit="layer", disable=not progress, file=sys.stderr)
    with bar, tensor_intrin_import_skipped(target), _interruptible() as interrupted:
        for name, func in bar:
            bar.set_postfix_str(name[:40])
            outcome = _tune_one(name, func, target, database, trials, runner)
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


def search_strategy(trials: int):
    """Evolutionary search with a population scaled to the budget (512 costs ~5 s/iteration on 2 cores)."""
    import tvm.s_tir.meta_schedule as ms

    return ms.search_strategy.EvolutionarySearch(population_size=min(512, max(32, 8 * trials)))


def _tune_one(name: str, func, target, database, trials: int, runner) -> LayerTuning:
    import tvm.s_tir.meta_schedule as ms

    mod = task_module(func)
    if database.query_tuning_record(mod, target, "main") is not None:
        return LayerTuning(name, "cached", 0, 0.0)
    before, start = len(database), time.perf_counter()
    drop_unnamed_ms_log_handlers()
    try:
        with tempfile.TemporaryDirectory(prefix="tvmsched-tune-") as work_dir, _ms_console_quieted():
            ms.tune_tir(
                mod, target, work_dir, max_trials_global=trials, num_trials_per_iter=min(trials, 64),
                builder=make_builder(), runner=runner or local_runner(), database=database,
                strategy=search_strategy(trials),
            )
    except TvmschedError:  # the database refused or is unreachable: the user must act
        raise
    except Exception as err:  # tuning failures fall back to the default schedule, reported
        log.warning("layer %s: tuning failed: %s", name, err)
        return LayerTuning(name, "fallback", len(database) - before, time.perf_counter() - start, one_line(err)[:200])
    return LayerTuning(name, "tuned", len(database) - before, time.perf_counter() - start)


def drop_unnamed_ms_log_handlers() -> None:
    """Avoid a crash of a second tune in one process whose logging has unnamed handlers (pytest's).

    MetaSchedule's `create_loggers` lists the handler names of its non-propagating logger and fails
    with "'NoneType' object has no attribute 'format'" on an unnamed one.
    """
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(logger.handlers):
        if handler.get_name() is None:
            logger.removeHandler(handler)


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


class _Discard(io.TextIOBase):
    """A text stream that drops everything (stays usable by handlers bound to it)."""

    def write(self, text: str) -> int:
        return len(text)


_DISCARD = _Discard()


@contextlib.contextmanager
def tensor_intrin_import_skipped(target):
    """On llvm, stand in an empty module for `tvm.s_tir.tensor_intrin` (fp32 CPU rules use none)."""
    key = "tvm.s_tir.tensor_intrin"
    if target.kind.name != "llvm" or key in sys.modules:
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
    Used where candidates are built here and measured on another machine (`tvmsched.measure_kit`).
    """
    import tvm.s_tir.meta_schedule as ms
    from tvm.s_tir.schedule import Schedule, Trace

    mod = task_module(func)
    with tensor_intrin_import_skipped(target):
        context = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply", task_name="main")
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
            if not all(proc.apply(sch) for proc in postprocs):
                continue
        except Exception:  # noqa: BLE001  (an invalid sample is skipped, as MetaSchedule does)
            continue
        found.setdefault(str(sch.trace.as_json()), sch)
    return list(found.values())
