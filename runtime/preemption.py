"""REEF-style preemption: per-task kernel queues, a background submitter, and a preempt flag.

Each task (a request stream over one artifact) owns an Executor, a queue of kernel launches and a
submitter thread that moves launches to the device, at most `max_in_flight` at a time (CPU
launches are synchronous, so one runs at a time there; GPU launches are tracked with CUDA events).

`preempt()`: pause the submitter, set the flag (kernels built by passes.preempt_flag then skip
their remaining blocks / chunks), wait until the device holds none of this task's work, and record
the launches that must run again: idempotent ones that were in flight, and non-idempotent ones that
never started. A non-idempotent kernel that started runs to its end and is never repeated.
`resume()`: clear the flag and re-submit those launches first, in order.
Outputs after any number of preempt/resume cycles are bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tvmsched.errors import TvmschedError

log = logging.getLogger(__name__)

DEFAULT_MAX_IN_FLIGHT = 8


class PreemptFlags:
    """The int32 flag array every instrumented kernel takes last (host memory on CPU, device on GPU)."""

    def __init__(self, device, length: int):
        import tvm

        from tvmsched.passes.preempt_flag import FLAG_SLOTS, STARTED_SLOT

        self.slots, self.started_slot = FLAG_SLOTS, STARTED_SLOT
        self.tensor = tvm.runtime.empty((length,), "int32", device)
        self.gpu = device.dlpack_device_type() != tvm.cpu().dlpack_device_type()
        if self.gpu:
            from cuda.bindings import driver

            from tvmsched.runtime.green_contexts import _check

            self._drv, self._check = driver, _check
            self._stream = _check(driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
            self._memset(0, length)
        else:
            self._host = np.from_dlpack(self.tensor)  # the kernels read this memory directly
            self._host[:] = 0

    def _memset(self, value: int, count: int) -> None:
        drv, check = self._drv, self._check
        pointer = self.tensor.data_ptr() if callable(self.tensor.data_ptr) else self.tensor.data_ptr
        check(drv.cuMemsetD32Async(drv.CUdeviceptr(int(pointer)), value, count, self._stream))
        check(drv.cuStreamSynchronize(self._stream))

    def set(self) -> None:
        if self.gpu:
            self._memset(1, self.slots)
        else:
            self._host[: self.slots] = 1

    def clear(self) -> None:
        if self.gpu:
            self._memset(0, self.slots)
        else:
            self._host[: self.slots] = 0

    @property
    def is_set(self) -> bool:
        return bool(self._host[0]) if not self.gpu else bool(self.tensor.numpy()[0])

    def clear_started(self) -> None:
        if not self.gpu:
            self._host[self.started_slot] = 0

    @property
    def started(self) -> bool:
        """Whether the last non-idempotent CPU kernel passed its entry check (and so ran to its end)."""
        return bool(self._host[self.started_slot])


@dataclass
class _Request:
    inputs: dict
    candidate_ids: list[int] | None
    future: Future
    submitted_at: float = field(default_factory=time.perf_counter)


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


class Task:
    """A request stream over one artifact, with its own kernel queue and submitter thread.

    Args:
        executor: the task's Executor (an artifact compiled with preempt checks, the default).
        name: for logs and threads.
        max_in_flight: launches the submitter keeps on the device at once (GPU; CPU runs one).
    """

    def __init__(self, executor, name: str = "task", max_in_flight: int = DEFAULT_MAX_IN_FLIGHT):
        if not executor.manifest.preempt_flags:
            raise TvmschedError("preemption needs an artifact compiled with preempt checks (the default)")
        if max_in_flight < 1:
            raise TvmschedError("max_in_flight must be at least 1")
        self.executor, self.name, self.max_in_flight = executor, name, max_in_flight
        self.flags = executor.flags
        self.gpu = executor.manifest.device == "cuda"
        if self.gpu and executor.reuse_distance < max_in_flight:
            executor.replan(max_in_flight)  # the in-flight launches must stay re-runnable
        self._idempotent = [[bool(c.idempotent) for c in layer.candidates] for layer in executor.manifest.layers]
        self._cond = threading.Condition()
        self._requests: collections.deque[_Request] = collections.deque()
        self._rerun: list[Launch] = []  # launches to repeat before anything else
        self._next_layer = 0  # next layer of the head request to launch
        self._in_flight: collections.deque[tuple[Launch, object]] = collections.deque()  # GPU: (launch, event)
        self._running: Launch | None = None  # being launched (GPU) or inside its kernel call (CPU)
        self._done: collections.deque = collections.deque()  # (future, outputs, error) to resolve
        self._paused = False
        self._closed = False
        self._request_ids = 0
        n_layers = len(executor.kernels)
        # progress bitmap: per layer the blocks completed for the running request (-1: no request); set when
        # a launch completes, and from the kernels' own counters (sync_progress) where they count
        self.progress = np.full(n_layers, -1, dtype=np.int64)
        self.counted = executor.counters is not None
        self._blocks = [[(c.progress_blocks if self.counted else c.blocks) or 1 for c in layer.candidates]
                        for layer in executor.manifest.layers]
        self._threads = [[c.threads or 1 for c in layer.candidates] for layer in executor.manifest.layers]
        self.timeline: list[tuple[str, int, int, float, float]] | None = None  # (task, layer, candidate, start, end)
        self._launched_at: dict[Launch, float] = {}
        self.launches = 0  # kernel launches, including re-runs
        self.reruns = 0
        self._thread = threading.Thread(target=self._submit_loop, name=f"submitter-{name}", daemon=True)
        self._thread.start()

    # ---- public ------------------------------------------------------------------------------

    def submit(self, inputs: dict, candidate_ids: list[int] | None = None) -> Future:
        """Queue one request; the future resolves to its outputs (or the error its inputs caused)."""
        future: Future = Future()
        with self._cond:
            if self._closed:
                raise TvmschedError(f"task {self.name} is closed")
            self._requests.append(_Request(inputs, candidate_ids, future))
            self._cond.notify_all()
        return future

    def preempt(self, abort: bool = True) -> PreemptReport:
        """Stop this task's work on the device as fast as possible; harmless when idle or already paused.

        abort=False only pauses the submitter and waits for the work on the device to end (the
        no-preemption baseline of the benchmarks).
        """
        start = time.perf_counter()
        with self._cond:
            if self._paused:
                return PreemptReport(0.0, tuple(self._rerun), ())
            self._paused = True
            if abort:
                self.flags.set()
            while self._running is not None:  # CPU: the kernel call returns within one chunk
                self._cond.wait()
            finished = self._drain_gpu() if self.gpu else []
            report = PreemptReport(time.perf_counter() - start, tuple(self._rerun), tuple(finished))
        self._deliver()
        return report

    def resume(self) -> None:
        """Clear the flag and let the submitter go on, re-running what preempt() aborted; harmless if running."""
        with self._cond:
            if not self._paused:
                return
            self.flags.clear()
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def state(self) -> StreamState | None:
        """The running request's progress and the queued requests' candidate ids; None when idle.

        CPU kernels with counters are read live (host memory); CUDA counters as last synced."""
        if self.counted and not self.gpu:
            self.sync_progress()
        with self._cond:
            if not self._requests:
                return None
            ids = self._requests[0].candidate_ids
            blocks = np.array([self._blocks[i][ids[i] if ids else 0] for i in range(len(self.progress))])
            queued = [r.candidate_ids for r in itertools.islice(self._requests, 1, None)]
            return StreamState(self.progress.copy(), blocks, ids, queued)

    def sync_progress(self) -> None:
        """Fold the kernels' progress counters into the bitmap (counts of re-run blocks capped at the layer's blocks)."""
        with self._cond:
            request = self._request_ids
        counts = self.executor.read_counters()
        with self._cond:
            if request != self._request_ids or not self._requests or self.progress[0] < 0:
                return  # another request started meanwhile, or none runs
            ids = self._requests[0].candidate_ids
            for layer, count in enumerate(counts):
                cand = ids[layer] if ids else 0
                done = min(int(count) // self._threads[layer][cand], self._blocks[layer][cand])
                self.progress[layer] = max(self.progress[layer], done)

    def record_timeline(self) -> None:
        """Keep (task, layer, candidate, start s, end s) of every launch from now on."""
        self.timeline = []

    @property
    def busy(self) -> bool:
        """Whether requests are queued or running."""
        with self._cond:
            return bool(self._requests)

    def close(self, timeout: float | None = None) -> None:
        """Finish queued requests (resuming if paused), then stop the submitter."""
        self.resume()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    # ---- submitter ----------------------------------------------------------------------------

    def _submit_loop(self) -> None:
        while True:
            with self._cond:
                # paused: wait without retiring anything (preempt() decides what completed)
                while not self._closed and (self._paused or (not self._requests and not self._in_flight)):
                    self._cond.wait()
                if self._closed and not self._requests and not self._in_flight:
                    return
                launch = self._next_launch() if self._requests else None
                self._running = launch  # preempt() waits until it is tracked (GPU) or returned (CPU)
            self._deliver()
            if self.gpu:
                self._gpu_step(launch)
            elif launch is not None:
                self._cpu_step(launch)

    def _next_launch(self) -> Launch | None:
        """The next launch to issue (called with the lock held), or None when the window is full."""
        if self.gpu and len(self._in_flight) >= self.max_in_flight:
            return None
        if self._rerun:
            return self._rerun.pop(0) if self._may_launch(self._rerun[0]) else None
        request = self._requests[0]
        n_layers = len(self.executor.kernels)
        if self._next_layer >= n_layers:
            return None  # all launched; waiting for the in-flight ones
        if self._next_layer == 0 and not self._start_request(request):
            return self._next_launch() if self._requests else None
        ids = request.candidate_ids
        launch = Launch(self._request_ids, self._next_layer, ids[self._next_layer] if ids else 0)
        if not self._may_launch(launch):
            return None
        self._next_layer += 1
        return launch

    def _may_launch(self, launch: Launch) -> bool:
        """GPU: a non-idempotent kernel waits until all earlier work is done, so its inputs are final."""
        return not (self.gpu and self._in_flight and not self._idempotent[launch.layer][launch.candidate])

    def _start_request(self, request: _Request) -> bool:
        """Copy a request's inputs in; a bad request fails its own future only."""
        try:
            if request.candidate_ids is not None:
                self._check_ids(request.candidate_ids)
            self.executor.set_inputs(request.inputs)
        except Exception as err:  # noqa: BLE001  (the caller gets it through the future)
            self._requests.popleft()
            self._done.append((request.future, None, err))
            return False
        self._request_ids += 1
        if self.counted:
            self.executor.reset_progress()
        self.progress[:] = 0
        return True

    def _check_ids(self, ids: list[int]) -> None:
        layers = self.executor.manifest.layers
        if len(ids) != len(layers) or any(not 0 <= c < len(layer.candidates) for c, layer in zip(ids, layers)):
            raise TvmschedError(f"candidate ids {ids} do not match the model's {len(layers)} layers and their candidates")

    def _cpu_step(self, launch: Launch) -> None:
        self.flags.clear_started()
        error = None
        self._launched_at[launch] = time.perf_counter()
        try:
            self.executor.run_layer(launch.layer, launch.candidate)
        except Exception as err:  # noqa: BLE001
            error = err
        with self._cond:
            self._running = None
            self.launches += 1
            if error is not None:
                self._fail_head(error)
            elif self.flags.is_set and not (not self._idempotent[launch.layer][launch.candidate] and self.flags.started):
                self._rerun.append(launch)  # aborted (or skipped at entry): run it again on resume
                self.reruns += 1
            else:
                self._retire(launch)
            self._cond.notify_all()
        self._deliver()

    def _gpu_step(self, launch: Launch | None) -> None:
        if launch is not None:
            self._launched_at[launch] = time.perf_counter()
            self.executor.run_layer(launch.layer, launch.candidate)
            event = self.executor.record_event()
            with self._cond:
                self._in_flight.append((launch, event))
                self._running = None
                self.launches += 1
                self._cond.notify_all()
            return
        with self._cond:  # window full or nothing to launch: retire finished launches
            while self._in_flight and self.executor.event_done(self._in_flight[0][1]):
                self._retire(self._in_flight.popleft()[0])
            busy = bool(self._in_flight)
        self._deliver()
        if busy:
            time.sleep(20e-6)

    def _drain_gpu(self) -> list[Launch]:
        """With the flag set: wait for in-flight launches; idempotent ones run again, others finished."""
        finished = []
        last = self._in_flight[-1][1] if self._in_flight else None
        if last is not None:  # one stream: the last launch ending means all ended
            self.executor.wait_event(last)
        while self._in_flight:
            launch, event = self._in_flight.popleft()
            if event is not last:
                self.executor.event_done(event)  # completed; this frees it
            if self._idempotent[launch.layer][launch.candidate]:
                self._rerun.append(launch)
                self.reruns += 1
            else:
                finished.append(launch)
                self._retire(launch)
        self._rerun.sort(key=lambda item: (item.request, item.layer))
        return finished

    def _retire(self, launch: Launch) -> None:
        """A launch completed; finishing the last layer completes the head request."""
        started = self._launched_at.pop(launch, None)
        if self.timeline is not None and started is not None:
            self.timeline.append((self.name, launch.layer, launch.candidate, started, time.perf_counter()))
        self.progress[launch.layer] = self._blocks[launch.layer][launch.candidate]
        if launch.layer != len(self.executor.kernels) - 1 or self._rerun:
            return
        request = self._requests.popleft()
        self._next_layer = 0
        self.progress[:] = -1
        try:
            self._done.append((request.future, self.executor.get_outputs(), None))
        except Exception as err:  # noqa: BLE001
            self._done.append((request.future, None, err))

    def _fail_head(self, error: Exception) -> None:
        request = self._requests.popleft()
        self._next_layer = 0
        self.progress[:] = -1
        self._rerun.clear()
        self._done.append((request.future, None, error))

    def _deliver(self) -> None:
        """Resolve finished requests' futures outside the lock (their callbacks may preempt or resume)."""
        while self._done:
            future, outputs, error = self._done.popleft()
            if error is None:
                future.set_result(outputs)
            else:
                future.set_exception(error)


class Priorities:
    """Real-time tasks preempt best-effort ones.

    A real-time request arriving while best-effort work runs preempts every best-effort task; they
    resume when no real-time request is queued or running any more.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._best_effort: list[Task] = []
        self._realtime_active = 0
        self.preemptions: list[PreemptReport] = []

    def add_best_effort(self, task: Task) -> None:
        with self._lock:
            self._best_effort.append(task)
            if self._realtime_active:
                self.preemptions.append(task.preempt())

    def submit_realtime(self, task: Task, inputs: dict, candidate_ids: list[int] | None = None) -> Future:
        with self._lock:
            self._realtime_active += 1
            if self._realtime_active == 1:
                for best_effort in self._best_effort:
                    if best_effort.busy:
                        self.preemptions.append(best_effort.preempt())
        try:
            future = task.submit(inputs, candidate_ids)
        except Exception:
            self._realtime_done(None)
            raise
        future.add_done_callback(self._realtime_done)
        return future

    def _realtime_done(self, _future) -> None:
        with self._lock:
            self._realtime_active -= 1
            if self._realtime_active == 0:
                for best_effort in self._best_effort:
                    best_effort.resume()
