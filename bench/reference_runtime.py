"""The Python runtime as it was before issue 38 moved the multi-tenant runtime into the engine: the policies of
runtime/policies/ decide in Python at submit, the Python switcher and priority policy act. Kept for one purpose:
bench/golden_decisions.py records these policies' decisions as the golden files the engine's C++ policies must match
(tests/data/golden/README.md). Not a product API: `tvmsched.runtime.Runtime` is the engine's.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import queue
import threading
import weakref
import gc
from concurrent.futures import Future
from dataclasses import dataclass, field
import logging

import numpy as np
import tvm_ffi

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native
from tvmsched.runtime import policies
from tvmsched.runtime.executor import Executor, candidate_list
from tvmsched.runtime.policies.priority import Priorities
from tvmsched.runtime.preemption import EngineFuture, Task, hold_gc, least_pending
from tvmsched.runtime.runtime import Model, _freeze_heap, _thaw_heap, candidate_info, colocation_table, find_model
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView, stream_work
from tvmsched.runtime.switching import SwitchSettings, Switcher, footprint
from tvmsched.runtime.tiering import TierSettings, TierShares

log = logging.getLogger(__name__)

PRIORITIES = ("realtime", "best_effort")


@dataclass
class RefModel(Model):
    """A model as the reference runtime keeps it: the policy's request views and its fcfs latencies besides."""

    # fcfs: measured from submit() in Python; the latest ones only, like the engine's (a server runs for long)
    serial_latencies_ms: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=1 << 14))
    # the policy's view of a request to each of its streams (`tasks`' order), rebuilt on every load and unload
    requests: tuple[policies.Request, ...] = field(default=(), repr=False)
    engine_ids: dict = field(default_factory=dict, repr=False)  # candidate-ID lists converted for the engine


class ReferenceRuntime:
    """The former `tvmsched.runtime.Runtime` (the same arguments: runtime/runtime.py), its policies deciding in Python
    at submit."""

    def __init__(self, device: str = "cpu", *, total_units: int | None = None, colocation: ColocationTable | str | None = None,
                 max_in_flight: int = 8, timeline: bool = False, policy: str = "colocation",
                 progress_interval_ms: float = 1.0, trusted_keys=(), memory_budget: int | None = None,
                 switching: SwitchSettings = SwitchSettings(), tiering: TierSettings = TierSettings(),
                 stall_timeout_s: float | None = None, freeze_gc: bool = True):
        if device not in ("cpu", "cuda"):
            raise TvmschedError(f"unknown device {device!r}: use cpu or cuda")
        self.device = device
        self.total_units = total_units or int(native.device_info(device)["total_units"])
        colocation = colocation_table(colocation, device, self.total_units)
        self.policy = policies.create(policy, table=colocation, total_units=self.total_units)
        self.models: dict[str, Model] = {}
        self._lock = threading.Lock()
        self._serial: queue.Queue | None = None  # serial policies: requests in arrival order, run one by one
        self._serial_thread: threading.Thread | None = None
        self._max_in_flight = max_in_flight
        self._timeline = timeline
        self._progress_interval_ms = progress_interval_ms
        self._closed = False
        self._started_us = float(native.now_us())
        self._trusted_keys = tuple(str(k) for k in trusted_keys)
        if memory_budget is not None and int(memory_budget) <= 0:
            raise TvmschedError(f"a memory budget must be a positive number of bytes, not {memory_budget}")
        self._memory_scope = native.create_memory_scope(int(memory_budget or 0))  # its models count against it alone
        self.switcher = Switcher(device, int(memory_budget or 0), switching, memory_scope=self._memory_scope)
        self.priorities = Priorities()
        # a switch-in waiting for memory that preempted requests keep: the priority policy decides (no cycle)
        self.switcher.on_blocked(functools.partial(_memory_blocked, weakref.ref(self.priorities)))
        self._memory_budget = None if memory_budget is None else int(memory_budget)
        self._budget_room = self._memory_budget
        self._tiering = tiering
        self._stall_timeout_s = stall_timeout_s
        self._freeze_gc = freeze_gc
        self._froze = False  # counted in _freezers (froze the heap at a load, not shut down yet)
        self._monitor = functools.partial(_monitor, self.models)  # the policies' view of the streams (no cycle)
        self._tier_shares: TierShares | None = None  # resolved by the first tiered model

    @property
    def scheduler(self):
        """The colocation policy's layer scheduler (its decisions), else None."""
        return getattr(self.policy, "scheduler", None)

    def load(self, artifact, *, qos_ms: float | None = None, priority: str = "best_effort", name: str | None = None,
             resident: bool = True, device_bytes: int | None = None, warmup: bool = False, streams: int = 1) -> Model:
        """Load an artifact (path or Artifact) as a new request stream: resident if it fits beside the
        resident models (`resident=False`: registered only), else registered and switched in by its
        first request (evicting the least recently used idle models). A model larger than the whole
        memory budget streams its weights from the host tiers and keeps `device_bytes` of device memory
        (default: all that is left). `warmup`: run every candidate kernel once before the model takes requests (the
        first request then pays no first-launch costs: a CUDA module's load, page faults). `streams`: serve it on that
        many streams, each a resident copy with its own memory (weights included), each request on the stream with the
        fewest pending: concurrent requests of a real-time model then run side by side instead of queueing behind
        each other."""
        if priority not in PRIORITIES:
            raise TvmschedError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 64:
            raise TvmschedError(f"streams must be a whole number from 1 to 64, not {streams!r}")
        executor = Executor(artifact, self.device, trusted_keys=self._trusted_keys,
                            register_groups=self.switcher.settings.max_groups, memory_scope=self._memory_scope)
        name = name or executor.manifest.model_name
        with self._lock:
            if self._closed:
                raise TvmschedError("the runtime is shut down")
            if name in self.models:
                raise TvmschedError(f"a model named {name!r} is already loaded")
        if self._budget_room is not None and footprint(executor) > self._budget_room:
            del executor  # registered only to measure it: its pinned host copy goes now
            executor = self._load_tiered(artifact, name, device_bytes)
        else:
            self.switcher.add(executor)
        tasks = [self._task(executor, name, priority)]  # plans its memory first; then its copies' (streams > 1)
        try:
            if executor.placement == "staged" and resident and not self.switcher.prefetch(executor):
                log.info("model %s does not fit beside the resident models: registered, switched in on demand", name)
            if streams > 1 and executor.placement == "streamed":
                raise TvmschedError(f"model {name} is larger than the memory budget (its weights stream from the host "
                                    f"tiers): it runs on one stream, not {streams}")
            for i in range(1, streams):
                copy = Executor(artifact, self.device, trusted_keys=self._trusted_keys, memory_scope=self._memory_scope)
                tasks.append(self._task(copy, f"{name}#{i}", priority))
        except Exception:
            for task in tasks:
                task.close()
            raise
        with self._lock:
            if name in self.models:
                for task in tasks:
                    task.close()
                raise TvmschedError(f"a model named {name!r} is already loaded")
            if self._timeline:
                for task in tasks:
                    task.record_timeline()
            layers = [[self._info(name, c) for c in layer.candidates] for layer in executor.manifest.layers]
            if self.scheduler is not None:
                self.scheduler.table.add_candidates(c for layer in layers for c in layer)
            model = RefModel(name, qos_ms or executor.manifest.qos_ms, priority, tasks[0], layers,
                          tuple(policies.fastest_ids(layers)), replicas=tuple(tasks[1:]))
            self.models[name] = model
            for each in self.models.values():  # built once, not per request (loaded_models changed)
                request = policies.Request(each.name, each.layers, each.qos_ms, self._monitor, self.total_units,
                                           len(self.models), each.fastest, choice=any(len(cands) > 1 for cands in each.layers))
                each.requests = tuple(dataclasses.replace(request, stream=task.name) for task in each.tasks)
        if warmup:
            self._warm_up(model)
        if priority == "best_effort":
            for each in model.tasks:
                self.priorities.add_best_effort(each)
        if self._freeze_gc:
            _freeze_heap(first=not self._froze)
            self._froze = True
        return model

    def _task(self, executor: Executor, name: str, priority: str) -> Task:
        """A stream of this runtime's for a model: real-time ones on high-priority device streams, others low."""
        return Task(executor, name, self._max_in_flight, self._progress_interval_ms, stall_timeout_s=self._stall_timeout_s,
                    quiet_gc=self._freeze_gc, priority="high" if priority == "realtime" else "low")

    def _warm_up(self, model: Model) -> None:
        """Run every candidate of every layer once (random inputs; as many requests as a layer has candidates)."""
        inputs = model.task.executor.random_inputs(0)
        for c in range(max(len(cands) for cands in model.layers)):
            ids = [min(c, len(cands) - 1) for cands in model.layers]
            for task in model.tasks:
                task.submit(inputs, ids).result(timeout=self._stall_timeout_s or 60)
        model.warm = True

    def _load_tiered(self, artifact, name: str, device_bytes: int | None) -> Executor:
        """Load a model larger than the budget with the device memory left and the tier shares left."""
        room = self._memory_budget - self.memory()["in_use"]
        if device_bytes is not None:
            if device_bytes > room:
                raise TvmschedError(f"model {name} asks for {device_bytes} bytes of device memory; {max(room, 0)} are left")
            room = int(device_bytes)
        if room <= 0:
            raise TvmschedError(f"model {name} is larger than the memory budget of {self._memory_budget} bytes and "
                                "no device memory is left to stream it through")
        if self._tier_shares is None:
            self._tier_shares = TierShares(self._tiering)
        try:
            executor = Executor(artifact, self.device, trusted_keys=self._trusted_keys,
                                tiered={"device_bytes": room, "buffer_bytes": self._tiering.buffer_bytes,
                                        "tiers": self._tier_shares.engine_tiers(), "in_flight": self._max_in_flight},
                                memory_scope=self._memory_scope)
        except TvmschedError as err:  # the engine's line says what streaming needs; the user set the budget
            raise TvmschedError(f"{err} (model {name} is larger than the Runtime's memory budget of "
                                f"{self._memory_budget} bytes, {room} of them left to stream it through)") from None
        info = native.tiering_info(executor.native)
        self._tier_shares.take(info)
        log.info("model %s is larger than the memory budget: %d bytes of its weights stay on the device, the rest "
                 "stream from %s", name, int(info["resident_weight_bytes"]),
                 ", ".join(f"{t['kind']} {int(t['used_bytes'])}" for t in info["tiers"] if int(t["used_bytes"])))
        return executor

    def _model(self, model: Model | str) -> Model:
        return find_model(self.models, model)

    def _info(self, model: str, candidate) -> CandidateInfo:
        return candidate_info(model, candidate, self.total_units)

    def submit(self, model: Model | str, inputs: dict[str, np.ndarray], *, priority: str | None = None,
               start_within_us: float | None = None) -> Future:
        """Schedule and queue one request; the future resolves to its outputs (or its error). `priority`: this
        request's ("realtime": it preempts the busy best-effort streams, its own model's excepted, while it runs;
        "best_effort": it preempts nothing), default the model's. `start_within_us`: a deadline to start; a request
        still queued that long after submit() fails with one line ("did not start within its deadline") instead
        of running late."""
        model = self._model(model)
        if self._closed:
            raise TvmschedError("the runtime is shut down")
        if priority is not None and priority not in PRIORITIES:
            raise TvmschedError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        quiet = hold_gc(self._freeze_gc)  # no collection starts in this code (freeze_gc)
        try:
            if model.replicas:  # the stream first: the policy estimates from when that one is free
                task = least_pending(model.tasks)
                request = model.requests[model.tasks.index(task)]
            else:
                task, request = model.task, model.requests[0]
            ids = _engine_ids(model, self.policy.choose(request))
            deadline = native.now_us() + start_within_us if start_within_us else 0
            if self.policy.serial:
                return self._serial_submit(model, inputs, ids, deadline)
            if (priority or model.priority) == "realtime":
                future = self.priorities.submit_realtime(task, inputs, ids, deadline)
            else:
                future = task.submit(inputs, ids, deadline)
            if not isinstance(future, EngineFuture):  # refused before it reached the engine's queue
                model.rejected += 1
            return future
        finally:
            if quiet:
                gc.enable()

    def _serial_submit(self, model: Model, inputs, ids, deadline_us: float = 0) -> Future:
        """One request at a time, in arrival order (the time-sharing baseline)."""
        future: Future = Future()
        with self._lock:  # queued before shutdown() sends the loop its end (under this lock), or refused
            if self._closed:
                raise TvmschedError("the runtime is shut down")
            if self._serial is None:
                self._serial = queue.Queue()
                self._serial_thread = threading.Thread(target=self._serial_loop, name="serial", daemon=True)
                self._serial_thread.start()
            self._serial.put((model, inputs, ids, future, native.now_us(), deadline_us))
        return future

    def _serial_loop(self) -> None:
        while True:
            item = self._serial.get()
            if item is None:  # shutdown(): every request queued before it has run
                return
            model, inputs, ids, future, sent_us, deadline_us = item
            try:
                outputs = model.task.submit(inputs, ids, deadline_us).result()
            except Exception as err:  # noqa: BLE001
                future.set_exception(err)
                continue
            model.serial_latencies_ms.append((native.now_us() - sent_us) / 1e3)  # counted before the caller wakes
            future.set_result(outputs)

    def monitor(self) -> dict[str, StreamView]:
        """The resource monitor: every busy stream's work still to run (from its progress bitmap and queue), by stream
        name (a model's name; the copies of a model loaded with `streams=N` are NAME#1 .. NAME#N-1)."""
        return _monitor(self.models)

    def stats(self) -> dict[str, dict]:
        """Per model: requests, errors, QoS violations, latency p50/p99 (ms), launches and re-runs (QoS violations
        and percentiles: of the latest 8192 to 16384 requests; the counts: since the model was loaded)."""
        out = {}
        for name, m in list(self.models.items()):
            counts = m.task.counts()
            latencies = m.serial_latencies_ms if self.policy.serial else [us / 1e3 for us in m.task.latencies_us()]
            lat = np.array(latencies) if latencies else None
            out[name] = {
                "priority": m.priority, "qos_ms": m.qos_ms, "requests": int(counts["completed"]), "errors": int(counts["failed"]) + m.rejected,
                "qos_violations": 0 if m.qos_ms is None or lat is None else int((lat > m.qos_ms).sum()),
                "p50_ms": None if lat is None else float(np.percentile(lat, 50)),
                "p99_ms": None if lat is None else float(np.percentile(lat, 99)),
                "launches": int(counts["launches"]), "reruns": int(counts["reruns"]),
                "faults": int(counts["faults"]), "fault_restarts": int(counts["fault_restarts"]),
            }
        decisions = [d.seconds * 1e6 for d in self.scheduler.decisions] if self.scheduler is not None else []
        out["_device"] = native.device_faults(self.device)  # docs/faults.md: the device's fault state machine
        out["_scheduler"] = {"decisions": self.scheduler.decided if self.scheduler is not None else 0,  # p50/p99: the last 10k
                             "p50_us": float(np.percentile(decisions, 50)) if decisions else None,
                             "p99_us": float(np.percentile(decisions, 99)) if decisions else None}
        return out

    def shutdown(self, wait: bool = True) -> None:
        """Finish queued requests, then stop every stream's submitter."""
        with self._lock:
            self._closed = True
            models = list(self.models.values())
            serial, self._serial_thread = self._serial_thread, None
            if serial is not None:
                self._serial.put(None)
        for model in models:  # a paused stream would hold up the others' queued requests (its memory, a serial turn)
            for task in model.tasks:
                task.resume()
        if serial is not None:  # serial policies: the requests it queued run first
            serial.join()
        for model in models:
            for task in model.tasks:
                task.close()
            if model.tiered:  # its tier memory and disk file go now, not when the last reference does
                native.release_tiers(model.task.executor.native)
        self.switcher.close()
        if self._froze:
            self._froze = False
            _thaw_heap()


def _memory_blocked(priorities: weakref.ref, waiting, holders: list) -> None:
    """The switcher's report of a switch-in held up by preempted requests, for the priority policy."""
    policy = priorities()
    if policy is not None:
        policy.memory_blocked(waiting, holders)


def _monitor(models: dict[str, Model]) -> dict[str, StreamView]:
    """Every busy stream by its name (a model's first stream: the model's name; its copies: NAME#i)."""
    views = {}
    for model in list(models.values()):
        for task in model.tasks:
            state = task.state()
            if state is not None:
                views[task.name] = StreamView(task.name, stream_work(model.layers, state))
    return views


def _engine_ids(model: Model, ids) -> tvm_ffi.Array:
    """A policy's candidate-ID list as the engine takes it, converted once per distinct list (up to 16 per model)."""
    key = tuple(ids)
    found = model.engine_ids.get(key)
    if found is None:
        found = tvm_ffi.convert(candidate_list(ids))
        if len(model.engine_ids) < 16:
            model.engine_ids[key] = found
    return found


