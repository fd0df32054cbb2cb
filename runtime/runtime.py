"""The embeddable multi-tenant runtime: many models, one device, per-request candidate choice.

    rt = Runtime("cpu")
    resnet = rt.load("resnet.tvms", qos_ms=20, priority="realtime")
    bert = rt.load("bert.tvms", qos_ms=200)
    outputs = rt.submit(resnet, {"input": x}).result()     # or: await rt.infer(resnet, {...})
    rt.stats(); rt.export_timeline("trace.json"); rt.shutdown()

Each loaded model is a request stream (a preemption Task with its own submitter thread) over its
own Executor. A request's candidate-ID list comes from the layer scheduler, which reads the
resource monitor (the other streams' progress bitmaps and the candidates of their remaining
layers). Real-time models preempt best-effort ones (runtime.preemption.Priorities).
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError
from tvmsched.runtime.executor import Executor
from tvmsched.runtime.preemption import Priorities, Task
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, LayerScheduler, StreamView, stream_work

log = logging.getLogger(__name__)

PRIORITIES = ("realtime", "best_effort")
POLICIES = ("colocation", "fastest", "partition", "fcfs")


@dataclass
class Model:
    name: str
    qos_ms: float | None
    priority: str
    task: Task
    layers: list[list[CandidateInfo]]
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    violations: int = 0


class Runtime:
    """Serve several compiled models on one device (thread-safe; see the module docstring).

    Args:
        device: "cpu" or "cuda".
        total_units: the device's compute units (default: CPU threads / the SMs of the GPU).
        colocation: a ColocationTable, or the URL of a tuning database holding this device's profile
            (`tvmsched profile-coloc --db`); default: none, the fallback rule for every pair.
        max_in_flight: launches each stream keeps on a GPU at once.
        timeline: record every launch for `export_timeline`.
        progress_interval_ms: how often the CUDA kernels' progress counters are copied to the host
            (artifacts compiled with progress counters; CPU counters are host memory, read when needed).
        policy: "colocation" (the layer scheduler), or the baselines "fastest" (concurrent streams,
            fastest candidates), "partition" (each model's fastest candidates within an even share of
            the units), "fcfs" (one request at a time in arrival order, fastest candidates).
    """

    def __init__(self, device: str = "cpu", *, total_units: int | None = None, colocation: ColocationTable | str | None = None,
                 max_in_flight: int = 8, timeline: bool = False, policy: str = "colocation",
                 progress_interval_ms: float = 1.0):
        if device not in ("cpu", "cuda"):
            raise TvmschedError(f"unknown device {device!r}: use cpu or cuda")
        if policy not in POLICIES:
            raise TvmschedError(f"policy must be one of {POLICIES}, not {policy!r}")
        self.policy = policy
        self._fcfs_queue: queue.Queue | None = None  # "fcfs": requests in arrival order, run one by one
        self.device = device
        self.total_units = total_units or _device_units(device)
        if isinstance(colocation, str):  # a tuning-database URL holding this device's profile
            from tvmsched.runtime.colocation import device_name, table_from_rows
            from tvmsched.tuning_db import open_store

            colocation = table_from_rows(open_store(colocation).colocation(device_name(device)), self.total_units)
        self.scheduler = LayerScheduler(colocation or ColocationTable(self.total_units))
        self.priorities = Priorities()
        self.models: dict[str, Model] = {}
        self._lock = threading.Lock()
        self._max_in_flight = max_in_flight
        self._timeline = timeline
        self._closed = False
        self._started = time.perf_counter()
        self._progress_interval = progress_interval_ms / 1e3
        self._progress_thread: threading.Thread | None = None

    def load(self, artifact, *, qos_ms: float | None = None, priority: str = "best_effort", name: str | None = None) -> Model:
        """Load an artifact (path or Artifact) as a new request stream."""
        if priority not in PRIORITIES:
            raise TvmschedError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        executor = Executor(artifact, self.device)
        name = name or executor.manifest.model_name
        with self._lock:
            if self._closed:
                raise TvmschedError("the runtime is shut down")
            if name in self.models:
                raise TvmschedError(f"a model named {name!r} is already loaded")
            task = Task(executor, name, self._max_in_flight)
            if self._timeline:
                task.record_timeline()
            layers = [[self._info(name, c) for c in layer.candidates] for layer in executor.manifest.layers]
            self.scheduler.table.add_candidates(c for layer in layers for c in layer)
            model = Model(name, qos_ms or executor.manifest.qos_ms, priority, task, layers)
            self.models[name] = model
        if priority == "best_effort":
            self.priorities.add_best_effort(task)
        if task.counted and task.gpu and self._progress_thread is None:
            self._progress_thread = threading.Thread(target=self._sync_progress, name="progress-sync", daemon=True)
            self._progress_thread.start()
        return model

    def _sync_progress(self) -> None:
        """CUDA: copy the running streams' progress counters to their bitmaps every interval."""
        while not self._closed:
            for model in list(self.models.values()):
                if model.task.counted and model.task.busy:
                    try:
                        model.task.sync_progress()
                    except Exception as err:  # noqa: BLE001  (the bitmap still advances as launches complete)
                        log.warning("progress counters of %s unreadable, no longer synced: %s", model.name, err)
                        return
            time.sleep(self._progress_interval)

    def _info(self, model: str, candidate) -> CandidateInfo:
        units = candidate.units or self.total_units  # None / 0: all units
        latency = candidate.latency_us if candidate.latency_us is not None else 1.0
        return CandidateInfo(min(units, self.total_units), latency, f"{model}/{candidate.kernel}")

    def submit(self, model: Model | str, inputs: dict[str, np.ndarray]) -> Future:
        """Schedule and queue one request; the future resolves to its outputs (or its error)."""
        model = self.models[model] if isinstance(model, str) else model
        with self._lock:
            if self._closed:
                raise TvmschedError("the runtime is shut down")
            ids = self._candidate_ids(model)
        sent = time.perf_counter()
        if self.policy == "fcfs":
            future = self._fcfs_submit(model, inputs, ids)
        elif model.priority == "realtime":
            future = self.priorities.submit_realtime(model.task, inputs, ids)
        else:
            future = model.task.submit(inputs, ids)
        future.add_done_callback(lambda f: self._finished(model, f, sent))
        return future

    def _candidate_ids(self, model: Model) -> list[int]:
        if self.policy == "colocation":
            views = self.monitor()
            own = views.pop(model.name, None)  # this request starts when its own stream's earlier work is done
            start_us = sum(c.latency_us for c in own.remaining) if own else 0.0
            decision = self.scheduler.choose(model.name, model.layers, model.qos_ms, list(views.values()), start_us)
            return list(decision.candidate_ids)
        if self.policy == "partition":
            share = max(1, self.total_units // max(1, len(self.models)))
            fits = lambda cands: [c for c in range(len(cands)) if cands[c].units <= share] or list(range(len(cands)))
            return [min(fits(cands), key=lambda c: cands[c].latency_us) for cands in model.layers]
        return [min(range(len(cands)), key=lambda c: cands[c].latency_us) for cands in model.layers]

    def _fcfs_submit(self, model: Model, inputs, ids) -> Future:
        """One request at a time, in arrival order (the time-sharing baseline)."""
        if self._fcfs_queue is None:
            self._fcfs_queue = queue.Queue()
            threading.Thread(target=self._fcfs_loop, name="fcfs", daemon=True).start()
        future: Future = Future()
        self._fcfs_queue.put((model, inputs, ids, future))
        return future

    def _fcfs_loop(self) -> None:
        while True:
            model, inputs, ids, future = self._fcfs_queue.get()
            try:
                future.set_result(model.task.submit(inputs, ids).result())
            except Exception as err:  # noqa: BLE001
                future.set_exception(err)

    async def infer(self, model: Model | str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """asyncio form of submit()."""
        return await asyncio.wrap_future(self.submit(model, inputs))

    def _finished(self, model: Model, future: Future, sent: float) -> None:
        latency_ms = (time.perf_counter() - sent) * 1e3
        with self._lock:
            if future.exception() is not None:
                model.errors += 1
                return
            model.latencies_ms.append(latency_ms)
            if model.qos_ms is not None and latency_ms > model.qos_ms:
                model.violations += 1

    def monitor(self) -> dict[str, StreamView]:
        """The resource monitor: every busy stream's work still to run (from its progress bitmap and queue)."""
        views = {}
        for name, model in self.models.items():
            state = model.task.state()
            if state is not None:
                views[name] = StreamView(name, stream_work(model.layers, state))
        return views

    def stats(self) -> dict[str, dict]:
        """Per model: requests, errors, QoS violations, latency p50/p99 (ms), launches and re-runs."""
        out = {}
        with self._lock:
            for name, m in self.models.items():
                lat = np.array(m.latencies_ms) if m.latencies_ms else None
                out[name] = {
                    "priority": m.priority, "qos_ms": m.qos_ms, "requests": len(m.latencies_ms), "errors": m.errors,
                    "qos_violations": m.violations,
                    "p50_ms": None if lat is None else float(np.percentile(lat, 50)),
                    "p99_ms": None if lat is None else float(np.percentile(lat, 99)),
                    "launches": m.task.launches, "reruns": m.task.reruns,
                }
        decisions = [d.seconds * 1e6 for d in self.scheduler.decisions]
        out["_scheduler"] = {"decisions": len(decisions),
                             "p50_us": float(np.percentile(decisions, 50)) if decisions else None,
                             "p99_us": float(np.percentile(decisions, 99)) if decisions else None}
        return out

    def export_timeline(self, path: str | Path, png: str | Path | None = None) -> int:
        """Write the recorded launches as Chrome-trace / Perfetto JSON (and a PNG); returns the event count."""
        events = []
        for model in self.models.values():
            for task, layer, cand, start, end in model.task.timeline or []:
                events.append({"name": f"L{layer}:c{cand}", "cat": model.priority, "ph": "X", "pid": 0, "tid": task,
                               "ts": (start - self._started) * 1e6, "dur": (end - start) * 1e6,
                               "args": {"layer": layer, "candidate": cand,
                                        "units": model.layers[layer][cand].units}})
        Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        if png is not None:
            plot_timeline(events, png)
        return len(events)

    def shutdown(self, wait: bool = True) -> None:
        """Finish queued requests, then stop every stream's submitter."""
        with self._lock:
            self._closed = True
            models = list(self.models.values())
        for model in models:
            model.task.close(None if wait else 0)

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def plot_timeline(events: list[dict], path: str | Path) -> None:
    """Kernels per stream over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    streams = sorted({e["tid"] for e in events})
    fig, ax = plt.subplots(figsize=(12, 1 + 0.6 * len(streams)))
    for row, stream in enumerate(streams):
        spans = [(e["ts"] / 1e3, e["dur"] / 1e3) for e in events if e["tid"] == stream]
        ax.broken_barh(spans, (row - 0.35, 0.7), linewidth=0.2, edgecolor="black")
    ax.set_yticks(range(len(streams)), streams)
    ax.set_xlabel("ms")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _device_units(device: str) -> int:
    if device == "cuda":
        from tvmsched.runtime.green_contexts import GreenContexts

        return GreenContexts(0).sm_count
    from tvmsched.runtime.units import full_cpu_units

    return full_cpu_units()
