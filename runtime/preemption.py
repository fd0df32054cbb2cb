"""REEF-style preemption on the native engine: one Task = one tenant's request stream.

The mechanism lives in runtime/native (StreamObj): a request queue, a submitter thread keeping at
most `max_in_flight` launches on the device (CPU launches are synchronous), the preempt flag that
instrumented kernels check, and the rerun rules:

`preempt()`: pause the submitter, set the flag (kernels built by passes.preempt_flag then skip
their remaining blocks / chunks), wait until the device holds none of this task's work, and record
the launches that must run again: idempotent ones that were in flight, and non-idempotent ones that
never started. A non-idempotent kernel that started runs to its end and is never repeated.
`resume()`: clear the flag and re-submit those launches first, in order.
Outputs after any number of preempt/resume cycles are bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from concurrent.futures._base import FINISHED, PENDING, RUNNING
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native
from tvmsched.runtime.executor import Executor, candidate_list, from_engine, to_engine
from tvmsched.runtime.policies.priority import Priorities  # the real-time policy (re-exported: public API)

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 8
WAIT_SPIN_US = float(os.environ.get("TVMSCHED_WAIT_SPIN_US", "100"))  # result() polls this long before sleeping
IDLE_SPIN_US = float(os.environ.get("TVMSCHED_IDLE_SPIN_US", "200"))  # an idle submitter polls this long

__all__ = ["EngineFuture", "Launch", "PreemptReport", "Priorities", "StreamState", "Task"]


class StreamState(NamedTuple):
    """What the resource monitor reads of a request stream."""

    done: np.ndarray  # per layer, blocks the running request has completed (-1: not started)
    blocks: np.ndarray  # per layer, the blocks of its chosen candidate
    ids: list[int] | None  # the running request's candidate ids (None: candidate 0 everywhere)
    queued: list[list[int] | None]  # candidate ids of the requests queued behind it, in order


@dataclass(frozen=True)
class Launch:
    """One kernel launch of one request: layer `layer` with candidate `candidate`."""

    request: int
    layer: int
    candidate: int


@dataclass(frozen=True)
class PreemptReport:
    """What one preempt() did."""

    seconds: float  # from the call to the device holding none of this task's work
    rerun: tuple[Launch, ...]  # launches that resume() submits again, in order
    finished: tuple[Launch, ...]  # non-idempotent launches that were let run to their end


class EngineFuture(Future):
    """A Future over an engine request: result() waits in C++ (GIL released); callbacks are asked for
    only when someone adds one, so a plain submit().result() costs no Python call from the engine.

    `output_names`: the model's outputs (read by name: iterating the engine's map costs ~4 µs); `quiet_gc`: no
    automatic garbage collection starts while it converts the outputs (`hold_gc`); `engine_tensors`: the result is
    the engine's map of output tensors, unconverted."""

    def __init__(self, request, output_names: tuple[str, ...] | None = None, quiet_gc: bool = False,
                 engine_tensors: bool = False):
        super().__init__()
        self._engine_tensors = engine_tensors
        self.request = request
        self._watched = False
        self._names = output_names
        self._quiet_gc = quiet_gc

    def _pull(self, *_):
        quiet = hold_gc(self._quiet_gc)
        try:
            with self._condition:  # an RLock: set_result below takes it again
                if self._state not in _OPEN:
                    return
                error = self.request.error()
                if error:
                    self.set_exception(TvmschedError(str(error)))
                else:
                    outputs = self.request.outputs()
                    self.set_result(outputs if self._engine_tensors else from_engine(outputs, self._names))
        finally:
            if quiet:
                gc.enable()

    def done(self) -> bool:
        if self._state in _OPEN and self.request.done():
            self._pull()
        return super().done()

    def _wait(self, timeout: float | None, spin_us: float = WAIT_SPIN_US) -> None:
        if self._state not in _OPEN:
            return
        # the poll (at most spin_us, bounded) and the conversion hold automatic garbage collection off (`quiet_gc`), so
        # a collection that falls due meanwhile runs after result() returns, in the caller's code: with the collector
        # on, the wait's first allocation ran the collections of a client's garbage inside the request (p99 4.6x the
        # p50 with a 250k-object heap, bench/results/host_overhead.md); a sleeping wait runs with it on
        quiet = hold_gc(self._quiet_gc and spin_us > 0)
        try:
            if quiet:
                poll = spin_us if timeout is None else min(spin_us, max(0.0, timeout) * 1e6)
                started = time.perf_counter()
                if self.request.wait(0.0, poll):
                    self._pull()
                    return
                gc.enable()
                quiet, spin_us = False, 0.0
                if timeout is not None:
                    timeout = max(0.0, timeout - (time.perf_counter() - started))
            if not self.request.wait(-1.0 if timeout is None else float(timeout), spin_us):
                raise FutureTimeout()
            self._pull()
        finally:
            if quiet:
                gc.enable()

    def result(self, timeout: float | None = None, *, spin_us: float = WAIT_SPIN_US):
        """Future.result; `spin_us`: how long the wait polls (yielding its core) before it sleeps (a request expected
        to end within it is seen done without a sleeping thread's wake-up)."""
        self._wait(timeout, spin_us)
        if self._state == FINISHED and self._exception is None:  # the common case, without the condition's lock
            return self._result
        return super().result(0)

    def exception(self, timeout: float | None = None):
        self._wait(timeout)
        return super().exception(0)

    def add_done_callback(self, fn) -> None:
        with self._condition:
            watch, self._watched = not self._watched, True
        if watch:
            # on the engine's callback thread (or now, if already done): never on the stream's submitter, whose next
            # launch would wait for the GIL
            self.request.on_done(self._pull)
        super().add_done_callback(fn)


_OPEN = (PENDING, RUNNING)  # a concurrent.futures state before the result is set (read without its lock)


def hold_gc(enabled: bool = True) -> bool:
    """Whether a section of the request path should hold automatic garbage collection off: returns True when it
    disabled the collector (the caller then re-enables it in a `finally`). A collection that falls due inside
    runs at the next allocation after it instead, in the caller's code; only this package's own code and a bounded
    poll (result()'s spin) run with it off, never a sleeping wait for the device, so the garbage it holds back is
    bounded. Threads inside at once: the one that disabled it re-enables it as it leaves (a collection may then start
    in another still inside); it is never left off."""
    if enabled and gc.isenabled():
        gc.disable()
        return True
    return False


def failed_future(error: Exception) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


def default_stall_timeout_s() -> float:
    """The engine watchdog's stall timeout (seconds a request may wait for its model to be switched in before it
    fails with one line naming the stage): TVMSCHED_STALL_TIMEOUT_S, else 60 (0: no watchdog)."""
    text = os.environ.get("TVMSCHED_STALL_TIMEOUT_S", "").strip()
    try:
        value = float(text) if text else 60.0
    except ValueError:
        raise TvmschedError(f"TVMSCHED_STALL_TIMEOUT_S must be a number of seconds, not {text!r}") from None
    if not value >= 0:
        raise TvmschedError(f"TVMSCHED_STALL_TIMEOUT_S cannot be negative, not {text!r}")
    return value


def least_pending(tasks) -> "Task":
    """Of a model's streams (copies of it), the one with the fewest requests queued or running: where the next goes."""
    return min(tasks, key=lambda task: task.pending) if len(tasks) > 1 else tasks[0]


class Task:
    """A request stream over one artifact, with its own kernel queue and submitter thread (in the engine).

    Args:
        executor: the task's Executor (an artifact compiled with preempt checks, the default).
        name: for logs, threads and the timeline.
        max_in_flight: launches the submitter keeps on the device at once (GPU; CPU runs one).
        progress_interval_ms: CUDA kernels' progress counters are copied to the bitmap this often.
        quiet_gc: no automatic garbage collection starts inside submit() or its future's result() (`hold_gc`).
        priority: of the device streams its kernels launch on: "high" (a real-time tenant), "normal" or "low"
            (best-effort): CUDA stream priorities; the CPU's asynchronous mode lowers a low queue's thread (nice 10).
    """

    def __init__(self, executor: Executor, name: str = "task", max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 progress_interval_ms: float = 1.0, stall_timeout_s: float | None = None, *, quiet_gc: bool = False,
                 priority: str = "normal"):
        self.executor, self.name = executor, name
        self.quiet_gc = quiet_gc
        self.output_names = executor.output_names
        stall = default_stall_timeout_s() if stall_timeout_s is None else float(stall_timeout_s)
        if priority not in native.STREAM_PRIORITIES:
            raise TvmschedError(f"a stream priority is one of {tuple(native.STREAM_PRIORITIES)}, not {priority!r}")
        self.stream = native.create_stream(executor.native, name, max_in_flight, IDLE_SPIN_US, progress_interval_ms, stall,
                                           priority)

    @classmethod
    def over(cls, executor: Executor, stream, name: str, *, quiet_gc: bool = False) -> "Task":
        """A view of an engine stream that already serves `executor`'s model (one of the engine Runtime's)."""
        task = cls.__new__(cls)
        task.executor, task.name, task.quiet_gc = executor, name, quiet_gc
        task.output_names = executor.output_names
        task.stream = stream
        return task

    def submit(self, inputs: dict, candidate_ids: list[int] | None = None, deadline_us: float = 0) -> Future:
        """Queue one request; the future resolves to its outputs (or the error its inputs caused). `deadline_us`
        (engine clock, native.now_us(); 0: none): a request still queued then fails with one line instead of
        starting late."""
        quiet = hold_gc(self.quiet_gc)
        try:
            if deadline_us:
                request = self.stream.submit_by(to_engine(inputs), candidate_list(candidate_ids), float(deadline_us))
            else:
                request = self.stream.submit(to_engine(inputs), candidate_list(candidate_ids))
            return EngineFuture(request, self.output_names, self.quiet_gc)
        except TvmschedError as err:
            if "is closed" in str(err):
                raise
            return failed_future(err)
        finally:
            if quiet:
                gc.enable()

    def preempt(self, abort: bool = True, wait: bool = True) -> PreemptReport:
        """Stop this task's work on the device as fast as possible; harmless when idle or already paused.

        abort=False only pauses the submitter and waits for the work on the device to end (the
        no-preemption baseline of the benchmarks). wait=False returns once the flag is set and the task paused
        (the report names no launches): on a GPU the task's own thread then waits for what it has in flight,
        and a resume() or a waiting preempt() waits for that first."""
        report = self.stream.preempt(abort, wait)
        launches = lambda items: tuple(Launch(*map(int, item)) for item in items)
        return PreemptReport(float(report["seconds"]), launches(report["rerun"]), launches(report["finished"]))

    def resume(self, wait: bool = True) -> None:
        """Clear the flag and let the submitter go on, re-running what preempt() aborted; harmless if running.
        wait=False: on a GPU, a task whose own thread has yet to drain what a non-waiting preempt() left in flight
        resumes once it has (the caller does not wait; a preempt() before then cancels it)."""
        self.stream.resume(wait)

    def finish_started(self) -> bool:
        """A paused task whose request started runs that request to its end and pauses again (its queued requests
        wait); False when it is not paused or its request had not started. For a policy whose preemption holds
        up another model's switch-in (the started request keeps its memory until it ends)."""
        return bool(self.stream.finish_started())

    @property
    def paused(self) -> bool:
        return self.stream.paused()

    @property
    def busy(self) -> bool:
        """Whether requests are queued or running."""
        return self.stream.busy()

    @property
    def pending(self) -> int:
        """Requests queued or running (read without the stream's lock)."""
        return int(self.stream.pending())

    def state(self) -> StreamState | None:
        """The running request's progress and the queued requests' candidate ids; None when idle
        (CPU counters are read live; CUDA counters as last copied)."""
        state = self.stream.state()
        if state is None:
            return None
        ids = lambda items: [int(i) for i in items] or None
        return StreamState(np.array(list(state["done"]), dtype=np.int64), np.array(list(state["blocks"]), dtype=np.int64),
                           ids(state["ids"]), [ids(q) for q in state["queued"]])

    def record_timeline(self) -> None:
        """Keep every launch (request, layer, candidate, start, end) from now on."""
        self.stream.record_timeline(True)

    @property
    def timeline(self) -> list[tuple[str, int, int, float, float]]:
        """(task, layer, candidate, start s, end s) of each recorded launch (engine clock)."""
        return [(self.name, int(r[1]), int(r[2]), r[3] / 1e6, r[4] / 1e6) for r in self.stream.timeline()]

    def counts(self) -> dict[str, int]:
        """The engine's counts of this stream: launches (re-runs included), reruns, completed, failed,
        preemptions (times preempt() paused it)."""
        return {str(k): int(v) for k, v in self.stream.counts().items()}

    @property
    def launches(self) -> int:
        return self.counts()["launches"]

    @property
    def reruns(self) -> int:
        return self.counts()["reruns"]

    @property
    def preemptions(self) -> int:
        return self.counts()["preemptions"]

    def latencies_us(self) -> list[float]:
        """Submit-to-finish times of the latest completed requests (8192 to 16384; `counts()["completed"]`
        counts them all), in order (engine clock)."""
        return list(self.stream.latencies_us())

    def close(self, timeout: float | None = None) -> None:
        """Finish queued requests (resuming if paused), then stop the submitter."""
        self.stream.close()
