"""TuningDatabase: a MetaSchedule `Database` backed by a tuning store (SQLStore or RemoteStore).

Workloads are matched like TVM's JSON database: structural hash, then structural equality. An
in-process cache maps hashes to `Workload` objects and record ids to parsed `TuningRecord`s, so
repeated lookups during a tune do not re-parse JSON or replay traces.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Protocol

import tvm
import tvm_ffi
from tvm.ir import IRModule
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.database import PyDatabase, TuningRecord, Workload
from tvm.s_tir.meta_schedule.utils import _json_de_tvm
from tvm.s_tir.schedule import Schedule, Trace
from tvm.target import Target

from .store import RecordRow, WorkloadRow, open_store, target_hash

log = logging.getLogger(__name__)

GPU_KINDS = frozenset({"cuda", "rocm", "vulkan", "metal", "opencl", "webgpu"})
_FALLBACK_SCAN = 64  # records scanned for a same-kind target when the exact target has none


class Store(Protocol):
    """What TuningDatabase needs from a store (SQLStore and RemoteStore both provide it)."""

    def commit_workload(self, shash: str, mod_json: str, description: str = "") -> WorkloadRow: ...
    def find_workload(self, shash: str, mod_json: str | None = None) -> WorkloadRow | None: ...
    def get_workload(self, workload_id: int) -> WorkloadRow | None: ...
    def commit_record(self, workload_id: int, **fields: Any) -> RecordRow: ...
    def top_k(self, workload_id: int, k: int, **filters: Any) -> list[RecordRow]: ...
    def all_records(self) -> list[RecordRow]: ...
    def stats(self) -> dict[str, int]: ...


def workload_shash(mod: IRModule) -> str:
    """Structural hash of a module as MetaSchedule prints it (unsigned 64-bit decimal)."""
    return str(tvm_ffi.structural_hash(mod) & 0xFFFF_FFFF_FFFF_FFFF)


def mod_to_json(mod: IRModule) -> str:
    """TVM JSON text of a module (what the store keeps in `mod_json`)."""
    return tvm.ir.save_json(mod)


def mod_from_json(text: str) -> IRModule:
    """A module from TVM JSON text, or from MetaSchedule's `[shash, base64]` workload form."""
    obj = json.loads(text)
    if isinstance(obj, list):
        return Workload.from_json(obj).mod
    return tvm.ir.load_json(text)


def describe(mod: IRModule, limit: int = 500) -> str:
    """Short text naming each PrimFunc and its parameters' dtypes and shapes."""
    parts = []
    for gvar, func in mod.functions.items():
        if isinstance(func, tvm.tirx.PrimFunc):
            params = ", ".join(_describe_param(p) for p in func.params)
            parts.append(f"{gvar.name_hint}({params})")
    text = "; ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe_param(param: Any) -> str:
    ty = getattr(param, "ty", None)
    shape = getattr(ty, "shape", None)
    dtype = getattr(ty, "dtype", None) or getattr(param, "dtype", "?")
    if shape is None:
        return f"{param.name}: {dtype}"
    return f"{param.name}: {dtype}[{','.join(str(d) for d in shape)}]"


def as_target(target: Target | dict | str) -> Target:
    """A tvm Target from a Target, a JSON-style dict or a tag."""
    return target if isinstance(target, Target) else Target(target)


def target_dict(target: Target | dict | str) -> dict:
    """The target as a plain JSON-able dict (Target.export() holds tuples and TVM containers)."""
    return _json_de_tvm(as_target(target).export())


def target_to_json(target: Target | dict | str) -> str:
    """Canonical JSON text of a target (sorted keys)."""
    return json.dumps(target_dict(target), sort_keys=True)


def default_units(tdict: dict | None) -> tuple[int, str]:
    """Compute units a target implies: llvm -> ("num-cores", cpu_thread), GPUs -> (0 = all, gpu_sm)."""
    kind = (tdict or {}).get("kind", "llvm")
    if kind in GPU_KINDS:
        return 0, "gpu_sm"
    return int((tdict or {}).get("num-cores") or 0), "cpu_thread"


def _plain(obj: Any) -> Any:
    if isinstance(obj, (list, tuple)):
        return [_plain(item) for item in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return _json_de_tvm(obj)


def record_json(record: TuningRecord) -> tuple[Any, list[float] | None, dict | None, Any]:
    """(trace, run seconds, target dict, args info) of a record as plain JSON. `TuningRecord.as_json()` leaves a
    TransformLayout's IndexMap as an object (MetaSchedule's tensor-core schedules have them), which its own
    conversion then rejects; the trace's `as_json()` writes it as text."""
    try:
        return record.as_json()
    except TypeError:
        trace = _plain(record.trace.as_json())
        run_secs = None if record.run_secs is None else [float(s) for s in record.run_secs]
        tdict = None if record.target is None else _json_de_tvm(record.target.export())
        args = None if record.args_info is None else [_plain(a.as_json()) for a in record.args_info]
        return trace, run_secs, tdict, args


def record_from_json(obj: list, workload: Workload) -> TuningRecord:
    """`TuningRecord.from_json`, TVM's tensor intrinsics loaded first where the trace tensorizes (a record of
    MetaSchedule's tensor-core rule names WMMA intrinsics, which must be registered to parse it)."""
    try:
        return TuningRecord.from_json(obj, workload)
    except Exception as err:  # noqa: BLE001 - "TensorIntrin '...' is not registered" (a ValueError from the FFI)
        if "is not registered" not in str(err):
            raise
    from tvmsched.lower.intrinsics import load_tensor_intrinsics

    load_tensor_intrinsics()
    return TuningRecord.from_json(obj, workload)


def compute_blocks(mod: IRModule, trace: Trace) -> int | None:
    """Thread blocks / parallel extent of `trace` applied to `mod`; None if unknown or on error."""
    try:
        from tvmsched.passes.launch_geometry import thread_blocks
    except ImportError:
        return None
    try:
        sch = Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        blocks = thread_blocks(sch.mod)
        return None if blocks is None else int(blocks)
    except Exception:  # noqa: BLE001  (an analysis failure must never lose a record)
        log.debug("thread_blocks failed", exc_info=True)
        return None


@derived_object
class TuningDatabase(PyDatabase):
    """MetaSchedule database over a tuning store, scoped by compute units and target.

    Args:
        store: a SQLStore or RemoteStore.
        units: compute units stamped on committed records and required by lookups (None: stamp
            the record target's own count, e.g. llvm "num-cores" or 0 = all SMs; look up any).
        unit_kind: "gpu_sm" or "cpu_thread" (None: from the record's target kind).
        target: when set, lookups only return records of this target.
    """

    def __init__(
        self,
        store: Store,
        *,
        units: int | None = None,
        unit_kind: str | None = None,
        target: Target | dict | str | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.units = units
        self.unit_kind = unit_kind
        self.target = None if target is None else as_target(target)
        self.target_hash = None if target is None else target_hash(target_to_json(self.target))
        self._lock = threading.RLock()
        self._by_shash: dict[str, list[tuple[int, Workload]]] = {}
        self._by_id: dict[int, Workload] = {}
        self._ids: dict[Workload, int] = {}  # keyed by object identity; keeps the objects alive
        self._records: dict[int, TuningRecord] = {}

    # ---- workloads -------------------------------------------------------------------------

    def _remember(self, workload_id: int, shash: str, workload: Workload) -> Workload:
        self._by_shash.setdefault(shash, []).append((workload_id, workload))
        self._by_id.setdefault(workload_id, workload)
        self._ids[workload] = workload_id
        return workload

    def _resolve(self, mod: IRModule, *, commit: bool) -> tuple[int, Workload] | None:
        """(workload id, Workload) of a module: cache, then store, then (if `commit`) a new row."""
        shash = workload_shash(mod)
        with self._lock:
            for workload_id, workload in self._by_shash.get(shash, []):
                if tvm_ffi.structural_equal(workload.mod, mod):
                    return workload_id, workload
            mod_json = mod_to_json(mod)
            row = self.store.find_workload(shash, mod_json) or self._equal_row(shash, mod)
            if row is None:
                if not commit:
                    return None
                row = self.store.commit_workload(shash, mod_json, describe(mod))
            return row.id, self._remember(row.id, shash, Workload(mod))

    def _equal_row(self, shash: str, mod: IRModule) -> WorkloadRow | None:
        """The stored workload with this hash whose (differently serialised) module equals `mod`."""
        row = self.store.find_workload(shash)
        if row is None:
            return None
        try:
            return row if tvm_ffi.structural_equal(mod_from_json(row.mod_json), mod) else None
        except Exception:  # noqa: BLE001  (a foreign row that TVM cannot parse is not a match)
            log.debug("cannot parse workload %d", row.id, exc_info=True)
            return None

    def _workload_id(self, workload: Workload) -> int | None:
        with self._lock:
            if workload in self._ids:
                return self._ids[workload]
        found = self._resolve(workload.mod, commit=False)
        return None if found is None else found[0]

    def _workload_by_id(self, workload_id: int) -> Workload:
        with self._lock:
            if workload_id in self._by_id:
                return self._by_id[workload_id]
            row = self.store.get_workload(workload_id)
            if row is None:
                raise KeyError(workload_id)
            return self._remember(row.id, row.shash, Workload(mod_from_json(row.mod_json)))

    def workload_id(self, mod: IRModule) -> int | None:
        """The stored id of a module's workload, or None (never commits)."""
        found = self._resolve(mod, commit=False)
        return None if found is None else found[0]

    def has_workload(self, mod: IRModule) -> bool:
        """Whether a structurally equal module is stored."""
        return self._resolve(mod, commit=False) is not None

    def commit_workload(self, mod: IRModule) -> Workload:
        """Store the module unless an equal one is; return its Workload."""
        return self._resolve(mod, commit=True)[1]

    # ---- records ---------------------------------------------------------------------------

    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Store a record, stamped with this database's units and the schedule's block count."""
        workload_id = self._workload_id(record.workload)
        if workload_id is None:
            workload_id = self._resolve(record.workload.mod, commit=True)[0]
        trace_json, run_secs, tdict, args_info = record_json(record)
        if tdict is None and self.target is not None:
            tdict = target_dict(self.target)
        units, unit_kind = default_units(tdict)
        row = self.store.commit_record(
            workload_id,
            target_json=json.dumps(tdict, sort_keys=True),
            units=units if self.units is None else self.units,
            unit_kind=self.unit_kind or unit_kind,
            trace_json=json.dumps(trace_json),
            run_secs=[float(s) for s in run_secs or []],
            blocks=compute_blocks(record.workload.mod, record.trace),
            args_info_json=json.dumps(args_info),
        )
        with self._lock:
            self._records.setdefault(row.id, record)

    def _record(self, row: RecordRow, workload: Workload | None = None) -> TuningRecord:
        """The TuningRecord of a stored row (parsed once, then cached)."""
        with self._lock:
            cached = self._records.get(row.id)
        if cached is not None:
            return cached
        workload = workload or self._workload_by_id(row.workload_id)
        obj = [json.loads(row.trace_json), row.run_secs, json.loads(row.target_json),
               json.loads(row.args_info_json)]
        record = record_from_json(obj, workload)
        with self._lock:
            return self._records.setdefault(row.id, record)

    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        """The fastest valid records of a workload within this database's scope."""
        workload_id = self._workload_id(workload)
        if workload_id is None or top_k <= 0:
            return []
        rows = self.store.top_k(workload_id, top_k, target_hash=self.target_hash, units=self.units)
        return [self._record(row, workload) for row in rows]

    def get_all_tuning_records(self) -> list[TuningRecord]:
        """Every record of the store (all targets and units), oldest first.

        Records of workloads that TVM cannot parse (foreign rows) are left out, with a warning.
        """
        records, unreadable = [], set()
        for row in self.store.all_records():
            if row.workload_id in unreadable:
                continue
            try:
                records.append(self._record(row))
            except Exception:  # noqa: BLE001
                unreadable.add(row.workload_id)
                log.warning("skipping records of workload %d: not a TVM module", row.workload_id)
        return records

    def __len__(self) -> int:
        """Number of records in the store."""
        return int(self.store.stats()["records"])

    # ---- queries ---------------------------------------------------------------------------

    def query_tuning_record(
        self, mod: IRModule, target: Target, workload_name: str | None = None
    ) -> TuningRecord | None:
        """The best record of `mod` for `target` (this database's target when it has one).

        Records of exactly that target come first; failing those (and when this database is not
        bound to a target), the best record of the same target kind, e.g. another llvm triple.
        """
        found = self._resolve(mod, commit=False)
        if found is None:
            return None
        workload_id, workload = found
        wanted = self.target if self.target is not None else as_target(target)
        t_hash = self.target_hash or target_hash(target_to_json(wanted))
        rows = self.store.top_k(workload_id, 1, target_hash=t_hash, units=self.units)
        if not rows and self.target is None:
            rows = self._same_kind(workload_id, wanted.kind.name)
        return self._record(rows[0], workload) if rows else None

    def _same_kind(self, workload_id: int, kind: str) -> list[RecordRow]:
        rows = self.store.top_k(workload_id, _FALLBACK_SCAN, units=self.units)
        rows = [r for r in rows if (json.loads(r.target_json) or {}).get("kind") == kind]
        if rows:
            log.info("no record for this exact target; using one tuned for %s", rows[0].target_json)
        return rows[:1]

    def query_schedule(
        self, mod: IRModule, target: Target, workload_name: str | None = None
    ) -> Schedule | None:
        """The best record's schedule, replayed on `mod`."""
        record = self.query_tuning_record(mod, target, workload_name)
        if record is None:
            return None
        sch = Schedule(mod, debug_mask=0, error_render_level="detail")
        record.trace.apply_to_schedule(sch, remove_postproc=False)
        return sch

    def query_ir_module(
        self, mod: IRModule, target: Target, workload_name: str | None = None
    ) -> IRModule | None:
        """The best record's scheduled module."""
        sch = self.query_schedule(mod, target, workload_name)
        return None if sch is None else sch.mod


TuningDatabase.__qualname__ = "TuningDatabase"  # derived_object leaves its wrapper's qualname


def open_database(url: str | None = None, **scope: Any) -> TuningDatabase:
    """A TuningDatabase over the store at `url` (None: `default_url()`).

    `scope` takes TuningDatabase's keywords (units, unit_kind, target) and `token` for HTTP stores.

    Raises:
        TvmschedError: the URL scheme is not sqlite, postgresql or http(s).
    """
    token = scope.pop("token", None)
    return TuningDatabase(open_store(url, token=token), **scope)
