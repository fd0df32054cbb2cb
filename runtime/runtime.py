"""The embeddable multi-tenant runtime: many models, one device, per-request candidate choice.

    with Runtime("cpu") as rt:
        resnet = rt.load("resnet.tvms", qos_ms=20, priority="realtime")
        bert = rt.load("bert.tvms", qos_ms=200)
        outputs = rt.submit(resnet, {"input": x}).result()     # or: await rt.infer(resnet, {...})
        rt.stats(); rt.export_timeline("trace.json")

A typed wrapper over the engine's Runtime (tvmsched/runtime.h, docs/runtime.md "The engine's Runtime"): the engine
keeps the models, their placement, their streams, the queue of each model, the policy that decides when a stream
takes a request and with which candidates, admission, real-time preemption and the stats. Python hands over the
inputs and takes the result; no Python runs on a request's way through the engine.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native
from tvmsched.runtime import policies
from tvmsched.runtime.executor import Executor, to_engine
from tvmsched.runtime.preemption import (IDLE_SPIN_US, EngineFuture, Task, default_stall_timeout_s, failed_future,
                                         hold_gc)
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView
from tvmsched.runtime.switching import StageEvent, SwitchSettings, stage_events
from tvmsched.runtime.tiering import TierSettings, TierShares, device_shares

log = logging.getLogger(__name__)

PRIORITIES = ("realtime", "best_effort")
POLICIES = policies.KINDS
_PRIORITY_CODE = {None: -1, "realtime": 1, "best_effort": 0}


@dataclass
class Model:
    name: str
    qos_ms: float | None
    priority: str
    task: Task
    layers: list[list[CandidateInfo]]
    fastest: tuple[int, ...] = ()  # the fastest candidate of every layer
    warm: bool = False  # every candidate kernel ran once at load (Runtime.load(warmup=True))
    # more streams of the same model (Runtime.load(streams=)): a request runs on the first of them that is free
    replicas: tuple[Task, ...] = ()
    # split across devices (Runtime.load(split=True or plan=...)): their names, in the order its parts run; `task`
    # then describes the whole model (over its first part, whose manifest_json is the model's) and has no stream
    split: tuple[str, ...] = ()

    @property
    def tasks(self) -> tuple[Task, ...]:
        """Its streams: `task` first, then its replicas (none for a split model: its parts run on their devices'
        streams)."""
        return () if self.split else (self.task, *self.replicas)

    @property
    def resident(self) -> bool:
        """Whether its environment and every sub-task are on the device now (else a request switches it in)."""
        return self.task.executor.resident

    @property
    def tiered(self) -> bool:
        """Larger than the memory budget: its weights stream from the host tiers (runtime/tiering.py)."""
        return self.task.executor.placement == "streamed"

    @property
    def placement(self) -> str:
        """Where its memory is: "resident", "staged" (switched in by the switcher), "streamed" (tiered) or "split"
        (across several devices)."""
        return "split" if self.split else self.task.executor.placement


@dataclass
class _Decisions:
    """What `Runtime.scheduler` still offers of the policy's decisions: how many (the engine keeps their times)."""

    decided: int = 0
    p50_us: float | None = None
    p99_us: float | None = None
    table: ColocationTable | None = field(default=None, repr=False)
    monitor_p50_us: float | None = None  # of those times, reading every stream's state (the monitor)
    monitor_p99_us: float | None = None


class Runtime:
    """Serve several compiled models on one device (thread-safe; see the module docstring).

    Args:
        device: "cpu" or "cuda".
        total_units: the device's compute units (default: CPU threads / the SMs of the GPU).
        colocation: a ColocationTable, the URL of a tuning database holding this device's profile
            (`tvmsched profile-coloc --db`), or a profile's JSON file (`--out`); default: none, the fallback rule
            for every pair.
        max_in_flight: launches each stream keeps on a GPU at once.
        timeline: record every launch for `export_timeline`.
        policy: "colocation" (the layer scheduler), or the baselines "fastest" (concurrent streams, fastest
            candidates), "partition" (each model's fastest candidates within an even share of the units), "fcfs"
            (one request at a time in arrival order, fastest candidates). The engine's C++ policies
            (tvmsched/policy.h); they decide when a stream can launch, reading every stream's state.
        progress_interval_ms: how often the CUDA kernels' progress counters are copied to the host.
        trusted_keys: Ed25519 public key files: `load` accepts only artifact files one of them signed.
        memory_budget: bytes of device memory this Runtime's models may allocate (`memory()`; None: no budget of its
            own). Models that do not fit beside the resident ones are switched in when a request needs them
            (docs/switching.md); a model larger than the whole budget streams its weights from the host tiers.
        switching: the switching pipeline's settings (SwitchSettings).
        tiering: where models larger than the budget keep the weights they stream (TierSettings).
        stall_timeout_s: the engine's watchdog: a request that waits this long for its model to be switched in fails
            with one line naming the stage (None: TVMSCHED_STALL_TIMEOUT_S, else 60; 0: no watchdog).
        freeze_gc: keep Python's garbage collection out of requests (the heap is collected and frozen after each load;
            no automatic collection starts inside `submit()` or its future's `result()`). False: left alone.
    """

    def __init__(self, device: str = "cpu", *, total_units: int | None = None, colocation: ColocationTable | str | None = None,
                 max_in_flight: int = 8, timeline: bool = False, policy: str = "colocation",
                 progress_interval_ms: float = 1.0, trusted_keys=(), memory_budget: int | None = None,
                 switching: SwitchSettings = SwitchSettings(), tiering: TierSettings = TierSettings(),
                 stall_timeout_s: float | None = None, freeze_gc: bool = True, devices: tuple[str, ...] = ()):
        devices = tuple(str(d) for d in devices)
        if devices:  # ("cuda:1",): that one; several: each model whole on one, or a replica on each of load(devices=)
            device = devices[0].split(":")[0]
        if device not in ("cpu", "cuda"):
            raise TvmschedError(f"unknown device {device!r}: use cpu or cuda")
        if policy not in POLICIES:
            raise TvmschedError(f"policy must be one of {POLICIES}, not {policy!r}")
        if memory_budget is not None and int(memory_budget) <= 0:
            raise TvmschedError(f"a memory budget must be a positive number of bytes, not {memory_budget}")
        self.device = device
        self.total_units = total_units or int(native.device_info(device)["total_units"])
        if len(devices) > 1 and not total_units:  # each device's own units (a CPU device: its share of the cores)
            self.total_units = max(1, self.total_units // len(devices)) if device == "cpu" else self.total_units
        self._trusted_keys = tuple(str(k) for k in trusted_keys)
        table = colocation_table(colocation, device, self.total_units) if policy == "colocation" else None
        options = {"device": device, "policy": policy, "total_units": self.total_units, "max_in_flight": max_in_flight,
                   "idle_spin_us": IDLE_SPIN_US, "progress_interval_ms": float(progress_interval_ms),
                   "stall_timeout_s": default_stall_timeout_s() if stall_timeout_s is None else float(stall_timeout_s),
                   "trusted_keys": list(self._trusted_keys), "max_groups": switching.max_groups,
                   "threshold1": switching.threshold1, "threshold2": switching.threshold2,
                   "preset_count": switching.preset_count, "retain": switching.retain, "timeline": bool(timeline),
                   "colocation": [[a, b, float(r)] for (a, b), r in (table.measured.items() if table else ())]}
        if devices:
            options["devices"] = list(devices)
        if memory_budget is not None:  # a model larger than it streams from the host tiers: their shares, found now
            options.update(memory_budget=int(memory_budget), tier_buffer_bytes=int(tiering.buffer_bytes))
            if devices and tiering.plan is not None:  # each device its plan's shares: GPU id N is cpu:N / cuda:N
                options["device_tiers"] = [TierShares(tiering, device_shares(tiering, _device_number(d))).engine_tiers()
                                           for d in devices]
            else:
                options["tiers"] = TierShares(tiering).engine_tiers()
        self._engine = native.create_runtime(options)
        self.policy_kind = policy
        self._table_view = table
        self.models: dict[str, Model] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._started_us = float(native.now_us())
        self._freeze_gc = freeze_gc
        self._froze = False

    @property
    def scheduler(self) -> _Decisions | None:
        """The colocation policy's decisions (how many; the p50/p99 of their times in µs, and of the part spent reading
        the monitor) and its profile; None for the other policies."""
        if self.policy_kind != "colocation":
            return None
        d = self._engine.decisions()
        return _Decisions(int(d["decided"]), _or_none(d["p50_us"]), _or_none(d["p99_us"]), self._table_view,
                          _or_none(d["monitor_p50_us"]), _or_none(d["monitor_p99_us"]))

    def load(self, artifact, *, qos_ms: float | None = None, priority: str = "best_effort", name: str | None = None,
             resident: bool = True, device_bytes: int | None = None, warmup: bool = False, streams: int = 1,
             max_queue_delay_us: float = 0.0, preferred_batch_sizes: tuple[int, ...] = (), refresh_sizes: bool = False,
             queue_policy: dict | None = None, devices: tuple[int, ...] = (), split: bool = False,
             plan=None) -> Model:
        """Load an artifact (path or Artifact) as a new model; the engine decides its placement (docs/runtime.md).
        A model compiled for a batch (docs/batching.md): `max_queue_delay_us`, how long a free stream waits at most for
        the queued rows to reach the smallest of `preferred_batch_sizes` (each a compiled size; none: the largest);
        `refresh_sizes`, whether each size's run figure follows its launches (False: the figures measured at load).
        `queue_policy`: Triton's default_queue_policy as the engine takes it: timeout_action ("reject" or "delay"),
        default_timeout_us, allow_timeout_override, max_queue_size (docs/runtime.md). A runtime over several
        devices: `devices`, the device numbers to place a replica on (none: one, where the most memory is left;
        docs/multi-device.md). `split`: run it split across `devices` (none: every device in service), a group of
        layers each; `plan`: split as the memory planner's plan places it (a runtime.tiering.Plan with a task named
        as the artifact's file, or `name`): its sub-tasks' layers on their GPUs, GPU id N being the device cpu:N or
        cuda:N. A model larger than every device's memory budget is split too, when its parts fit."""
        if priority not in PRIORITIES:
            raise TvmschedError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        if isinstance(streams, bool) or not isinstance(streams, int) or not 1 <= streams <= 64:
            raise TvmschedError(f"streams must be a whole number from 1 to 64, not {streams!r}")
        if not isinstance(refresh_sizes, bool):
            raise TvmschedError(f"refresh_sizes must be True or False, not {refresh_sizes!r}")
        if self._closed:
            raise TvmschedError("the runtime is shut down")
        qos_ms = _above_zero("qos_ms", qos_ms, "milliseconds", "None: the artifact's latency target, if any")
        options = {"qos_ms": qos_ms or 0.0, "realtime": priority == "realtime",
                   "resident": bool(resident), "streams": streams, "warmup": bool(warmup),
                   "device_bytes": int(device_bytes or 0), "max_queue_delay_us": float(max_queue_delay_us),
                   "preferred_batch_sizes": [int(size) for size in preferred_batch_sizes],
                   "refresh_sizes": bool(refresh_sizes)}
        options.update(queue_policy or {})  # (the engine refuses an option it does not know, in one line)
        if devices:
            options["devices"] = [int(d) for d in devices]
        if name is not None:
            options["name"] = str(name)
        if split or plan is not None:
            options["split"] = True
        with tempfile.TemporaryDirectory(prefix="tvmsched-") as tmp:
            path = self._artifact_path(artifact, Path(tmp))
            if plan is not None:  # (its groups: the engine lays them out as the planner does, BalancedLayers)
                task = str(name) if name is not None else Path(str(artifact)).stem
                options["devices"] = plan_devices(plan, task, self.devices())
            loaded = str(self._engine.load(path, options))
            stats = self._engine.stats()[loaded]
            natives = self._engine.engine_models(loaded)
            if stats["placement"] == "split":  # its parts run on their devices: the whole model described
                tasks = [Task.over(Executor.over(natives[0], path), None, loaded, quiet_gc=self._freeze_gc)]
            else:
                parsed = {}  # (its streams share a manifest: parsed once)
                tasks = [Task.over(Executor.over(m, path, parsed), s, str(s.name()), quiet_gc=self._freeze_gc)
                         for m, s in zip(natives, self._engine.streams(loaded))]
        layers = [[candidate_info(loaded, c, self.total_units) for c in layer.candidates]
                  for layer in tasks[0].executor.manifest.layers]
        if self._table_view is not None:
            self._table_view.add_candidates(c for layer in layers for c in layer)
        model = Model(loaded, _or_none(stats["qos_ms"]), priority, tasks[0], layers,
                      tuple(policies.fastest_ids(layers)), warm=bool(warmup), replicas=tuple(tasks[1:]),
                      split=tuple(str(d) for d in stats.get("devices", ())) if stats["placement"] == "split" else ())
        with self._lock:
            self.models[loaded] = model
        if model.placement == "streamed":
            info = native.tiering_info(model.task.executor.native)
            log.info("model %s is larger than the memory budget: %d bytes of its weights stay on the device", loaded,
                     int(info["resident_weight_bytes"]))
        if self._freeze_gc:
            _freeze_heap(first=not self._froze)
            self._froze = True
        return model

    def _artifact_path(self, artifact, tmp: Path) -> str:
        from tvmsched.artifact.format import Artifact

        if isinstance(artifact, Artifact):
            if self._trusted_keys:
                raise TvmschedError("trusted keys check signed artifact files: pass the artifact's path, not an Artifact")
            from tvmsched.lower.targets import check_cpu_features

            check_cpu_features(artifact.manifest, f"the artifact of model {artifact.manifest.model_name}")
            path = tmp / "model.tvms"
            artifact.save(path)
            return str(path)
        return str(artifact)

    def _model(self, model: Model | str) -> Model:
        return find_model(self.models, model)

    def submit(self, model: Model | str, inputs: dict[str, np.ndarray], *, priority: str | None = None,
               start_within_us: float | None = None, engine_tensors: bool = False) -> Future:
        """Queue one request on its model; the future resolves to its outputs (or its error). `priority`: this
        request's ("realtime" preempts the busy best-effort streams, its own model's excepted, while it runs;
        "best_effort" preempts nothing), default the model's. `start_within_us`: the longest it may stay queued (a
        request still queued then fails with one line, "did not start within its deadline"). `engine_tensors`: the
        future resolves to the engine's map of output tensors, not numpy arrays (`tvmsched serve` encodes it in C++;
        `inputs` may be such a map too)."""
        model = self._model(model)
        if self._closed:
            raise TvmschedError("the runtime is shut down")
        start_within_us = _above_zero("start_within_us", start_within_us, "microseconds", "None: no deadline")
        if priority not in _PRIORITY_CODE:
            raise TvmschedError(f"priority must be one of {PRIORITIES}, not {priority!r}")
        code = _PRIORITY_CODE[priority]
        quiet = hold_gc(self._freeze_gc)
        try:
            request = self._engine.submit(model.name, to_engine(inputs), code, start_within_us or -1.0)
            return EngineFuture(request, model.task.output_names, self._freeze_gc, engine_tensors)
        except TvmschedError as err:
            if "is shut down" in str(err):
                raise
            return failed_future(err)  # (the engine counts it among its model's errors)
        finally:
            if quiet:
                gc.enable()

    async def infer(self, model: Model | str, inputs: dict[str, np.ndarray], *, priority: str | None = None,
                    start_within_us: float | None = None) -> dict[str, np.ndarray]:
        """asyncio form of submit()."""
        return await asyncio.wrap_future(self.submit(model, inputs, priority=priority, start_within_us=start_within_us))

    def monitor(self) -> dict[str, StreamView]:
        """The resource monitor: every busy stream's work still to run, by stream name (units and latency of each)."""
        return {str(name): StreamView(str(name), tuple(CandidateInfo(int(u), float(lat), "") for u, lat in work))
                for name, work in self._engine.monitor()}

    def stats(self) -> dict[str, dict]:
        """Per model: its placement (resident, staged: switched, or streamed), requests, errors, QoS violations, latency
        p50/p99 (ms), launches and re-runs, queue counters, executions (runs of the model: a model compiled for a batch
        runs several requests in one, docs/batching.md); `_device`: the device's fault state; `_scheduler`: the
        policy's decisions."""
        out = {}
        for name, s in self._engine.stats().items():
            name = str(name)
            out[name] = {"priority": str(s["priority"]), "placement": str(s["placement"]),
                         "qos_ms": _or_none(s["qos_ms"]), "requests": int(s["requests"]),
                         "errors": int(s["errors"]),
                         "qos_violations": int(s["qos_violations"]), "p50_ms": _or_none(s["p50_ms"]),
                         "p99_ms": _or_none(s["p99_ms"]), "launches": int(s["launches"]), "reruns": int(s["reruns"]),
                         "faults": int(s["faults"]), "fault_restarts": int(s["fault_restarts"]),
                         "refused": int(s["refused"]), "timed_out": int(s["timed_out"]), "queued": int(s["queued"]),
                         "executions": int(s["executions"]),
                         "batches": [tuple(int(x) for x in b) for b in s["batches"]],
                         "sizes": {int(b): {"run_us": float(us), "launches": int(n)} for b, us, n in s["sizes"]},
                         "devices": [str(d) for d in s.get("devices", ())]}  # (several devices: its replicas')
        d = self._engine.decisions()
        out["_device"] = native.device_faults(self.device)
        out["_scheduler"] = {"decisions": int(d["decided"]), "p50_us": _or_none(d["p50_us"]), "p99_us": _or_none(d["p99_us"]),
                             "finished_for_memory": int(self._engine.finished_for_memory())}
        return out

    def tiering(self, model: Model | str) -> dict:
        """A tiered model's placement: resident weight bytes, buffer bytes, groups, bytes per tier."""
        return tiering_report(self._model(model).task.executor.native)

    def tier_events(self) -> list[StageEvent]:
        events = []
        for model in list(self.models.values()):
            if model.tiered:
                events += stage_events(native.tiering_events(model.task.executor.native))
        return events

    def switch_events(self) -> list[StageEvent]:
        """The switcher's recorded stages (stage1, stage2, exec, clean, evict), in engine µs."""
        return stage_events(self._engine.switch_events())

    def memory(self) -> dict[str, int]:
        """The engine's accounting of this Runtime's model memory: in_use, peak and budget (0: none) in bytes."""
        return {str(k): int(v) for k, v in self._engine.memory().items()}

    def served(self, model: Model | str, *, version: str = "1", max_batch_size: int = 0, max_queue: int = 64,
               streams: int = 1, max_queue_delay_us: float = 0.0, preferred_batch_sizes=()):
        """What a server keeps of a loaded model it serves (the engine's tvmsched/serving.h, as the C++ server keeps
        it): admission by `max_queue`, Triton's counters, and the JSON of its metadata, model configuration and
        statistics (`native.func("served_statistics")`)."""
        return native.func("served")(self._engine, {
            "name": self._model(model).name, "version": str(version), "max_batch_size": int(max_batch_size),
            "max_queue": int(max_queue), "streams": int(streams), "max_queue_delay_us": float(max_queue_delay_us),
            "preferred_batch_sizes": [int(b) for b in preferred_batch_sizes]})

    def devices(self) -> list[dict]:
        """Per device the runtime serves: its name ("cpu", "cpu:1", "cuda:0"), units, whether it is lost (out of
        service), its memory (in_use, peak, budget), the models it holds and their requests queued there."""
        return [{"name": str(d["name"]), "units": int(d["units"]), "lost": bool(d["lost"]), "in_use": int(d["in_use"]),
                 "peak": int(d["peak"]), "budget": int(d["budget"]), "models": [str(m) for m in d["models"]],
                 "queued": int(d["queued"])} for d in self._engine.devices()]

    @property
    def memory_scope(self):
        """This Runtime's memory budget as the engine keeps it: a plain `Executor(path, memory_scope=rt.memory_scope)`
        counts against it (memory the switcher cannot evict)."""
        return self._engine.memory_scope()

    def evict(self, model: Model | str, keep_environment: bool = False) -> bool:
        """Evict a switched model now if it is idle (its environment too unless `keep_environment`); False when it is
        busy or not in memory. One line for a streamed model (its weights stream from the host tiers: not switched)."""
        return bool(self._engine.evict(self._model(model).name, bool(keep_environment)))

    def preempt(self, model: Model | str, abort: bool = True) -> list:
        """Pause every stream of a model (what it runs stops at a layer boundary; `abort`: a started request re-runs
        its unfinished layers); what is queued waits until `resume`. Returns each stream's PreemptReport."""
        model = self._model(model)
        if model.split:
            raise TvmschedError(f"model {model.name} is split across devices: its requests are not preempted")
        return [task.preempt(abort=abort) for task in model.tasks]

    def resume(self, model: Model | str) -> None:
        """Let a paused model's streams run again."""
        for task in self._model(model).tasks:
            task.resume()

    def export_timeline(self, path: str | Path, png: str | Path | None = None) -> int:
        """Write the recorded launches as Chrome-trace / Perfetto JSON (and a PNG); returns the event count."""
        return write_timeline(self.models.values(), self.switch_events() + self.tier_events(), self._started_us, path, png)

    def unload(self, model: Model | str, timeout_s: float = 60.0) -> None:
        """Stop serving a model: new requests are refused at once, its queued and running ones finish first, then its
        device memory (and tier shares) are freed and its name can be loaded again."""
        model = self._model(model)
        with self._lock:
            if self._closed:
                raise TvmschedError("the runtime is shut down")
            if self.models.get(model.name) is not model:
                raise TvmschedError(f"model {model.name!r} is not loaded")
            del self.models[model.name]
        self._engine.unload(model.name, float(timeout_s))
        model.replicas = ()
        log.info("model %s unloaded", model.name)

    @property
    def closed(self) -> bool:
        """Whether it was shut down."""
        return self._closed

    def shutdown(self, wait: bool = True) -> None:
        """Finish queued requests, then stop every stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._engine.shutdown()
        if self._froze:
            self._froze = False
            _thaw_heap()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _or_none(value) -> float | None:
    """An engine number where a negative one means "none"."""
    return None if float(value) < 0 else float(value)


def colocation_table(colocation, device: str, total_units: int) -> ColocationTable:
    """The colocation profile a Runtime's `colocation` argument names: a ColocationTable, a profile's JSON file
    (`tvmsched profile-coloc --out` rows), a tuning-database URL holding this device's profile, or None (the fallback
    rule for every pair)."""
    if isinstance(colocation, str) and colocation.endswith(".json"):
        from tvmsched.runtime.colocation import load_table

        if not Path(colocation).is_file():
            raise TvmschedError(f"no colocation profile at {colocation}")
        return load_table(colocation, total_units)
    if isinstance(colocation, str):
        from tvmsched.runtime.colocation import device_name, table_from_rows
        from tvmsched.tuning_db import open_store

        return table_from_rows(open_store(colocation).colocation(device_name(device)), total_units)
    return colocation or ColocationTable(total_units)


def find_model(models: dict[str, Model], model: Model | str) -> Model:
    """A loaded model by handle or name; one line naming the loaded ones when there is none."""
    if isinstance(model, Model):
        return model
    found = models.get(model) if isinstance(model, str) else None
    if found is None:
        raise TvmschedError(f"no model named {model!r} is loaded (loaded: {', '.join(models) or 'none'})")
    return found


def candidate_info(model: str, candidate, total_units: int) -> CandidateInfo:
    """What a policy knows of a manifest's candidate: units (one encoding: an explicit count), latency, profile key."""
    units = min(candidate.units or total_units, total_units)
    latency = candidate.latency_us if candidate.latency_us is not None else 1.0
    return CandidateInfo(units, latency, f"{model}/{candidate.kernel}")


_freezers = 0  # Runtimes with freeze_gc that froze the heap and are not shut down yet
_freezers_lock = threading.Lock()


def _freeze_heap(first: bool) -> None:
    """Collect once, then freeze what is left: later collections (gen 2 included) skip it."""
    global _freezers
    with _freezers_lock:
        _freezers += first
        gc.collect()
        gc.freeze()


def _thaw_heap() -> None:
    global _freezers
    with _freezers_lock:
        _freezers -= 1
        if _freezers == 0:
            gc.unfreeze()


def write_timeline(models, stages: list[StageEvent], started_us: float, path: str | Path, png: str | Path | None) -> int:
    """The models' recorded launches (a row per stream) and the switching / streaming `stages` (a row per model) as
    Chrome-trace / Perfetto JSON at `path` (and a PNG); returns the event count."""
    events = []
    started = started_us / 1e6
    for model in models:
        for task, layer, cand, start, end in [row for each in model.tasks for row in each.timeline]:
            events.append({"name": f"L{layer}:c{cand}", "cat": model.priority, "ph": "X", "pid": 0, "tid": task,
                           "ts": (start - started) * 1e6, "dur": (end - start) * 1e6,
                           "args": {"layer": layer, "candidate": cand, "units": model.layers[layer][cand].units}})
    for e in stages:
        events.append({"name": e.stage if e.group < 0 else f"{e.stage} g{e.group}", "cat": "switch", "ph": "X", "pid": 0,
                       "tid": f"{e.model} stages", "ts": e.start_us - started_us, "dur": e.end_us - e.start_us,
                       "args": {"group": e.group, "bytes": e.bytes}})
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
    if png is not None:
        plot_timeline(events, png)
    return len(events)


def tiering_report(native_model) -> dict:
    """A tiered model's placement: resident weight bytes, buffer bytes, groups, bytes per tier (engine's tiering_info),
    its device memory, and whether it takes turns for it with other streamed models (and holds it now)."""
    info = native.tiering_info(native_model)
    return {"resident_weight_bytes": int(info["resident_weight_bytes"]), "buffer_bytes": int(info["buffer_bytes"]),
            "buffers": int(info["buffers"]),
            "groups": int(info["groups"]), "streamed_group_bytes": [int(b) for b in info["streamed_group_bytes"]],
            "tiers": [{k: (str(v) if k == "kind" else int(v)) for k, v in t.items()} for t in info["tiers"]],
            "direct_io": bool(info["direct_io"]), "device_bytes": int(info["device_bytes"]),
            "takes_turns": bool(info["takes_turns"]), "in_memory": bool(info["in_memory"])}


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


def _device_number(device: str) -> int:
    """N of "cpu:N" / "cuda:N" (a lone "cpu" or "cuda": 0)."""
    return int(str(device).rpartition(":")[2] or 0) if ":" in str(device) else 0


def plan_devices(plan, task: str, devices: list[dict]) -> list[int]:
    """Where the memory planner's `plan` (runtime.tiering.Plan) puts `task`'s sub-tasks: the runtime's device numbers
    in sub-task order (GPU id N: the device named cpu:N or cuda:N). Their layers are the planner's split_layers, which
    the engine lays out itself (BalancedLayers)."""
    placements = sorted((p for p in plan.placements if p.task == task), key=lambda p: p.subtask)
    if not placements:
        tasks = sorted({p.task for p in plan.placements})
        raise TvmschedError(f"the plan has no task named {task!r} (its tasks: {', '.join(tasks) or 'none'}): pass the "
                            "plan's name for the model as name=")
    index = {_device_number(d["name"]): k for k, d in enumerate(devices)}
    for p in placements:
        if p.gpu not in index:
            raise TvmschedError(f"the plan puts {task} sub-task {p.subtask} on GPU {p.gpu}, which the runtime does not "
                                f"serve (its devices: {', '.join(d['name'] for d in devices)})")
    return [index[p.gpu] for p in placements]


def _above_zero(name: str, value, unit: str, none_means: str) -> float | None:
    """`value` as a float when it is a finite number above 0, None for None; anything else is one error line (a
    negative, zero or NaN latency target or deadline is never taken silently as none)."""
    if value is None:
        return None
    if (isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating))
            or not np.isfinite(value) or value <= 0):
        raise TvmschedError(f"{name} must be a finite number of {unit} above 0 ({none_means}), not {value!r}")
    return float(value)
