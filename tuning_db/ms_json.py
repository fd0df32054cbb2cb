"""Import / export MetaSchedule's own JSON database (a work_dir's two line-per-entry files).

`database_workload.json`: one `[shash, base64]` line per workload (MetaSchedule's base64 holds an
8-byte length prefix before the TVM JSON text, so we go through `Workload.from_json/as_json`).
`database_tuning_record.json`: one `[workload_line_index, [trace, run_secs, target, args_info]]`
line per record.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from tvm.s_tir.meta_schedule.database import Workload

from ..errors import TvmschedError, one_line
from .json_limits import loads as _bounded_loads
from .ms_adapter import TuningDatabase, mod_from_json, record_from_json

log = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def _lines(path: Path) -> list[tuple[int, Any]]:
    """(line number, JSON value) of a file's non-empty lines ([] if the file is missing).

    Raises:
        TvmschedError: the file cannot be read, or a line is not JSON (or nests too deeply to parse).
    """
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise TvmschedError(f"cannot read {path}: {getattr(err, 'strerror', None) or one_line(err)}") from None
    values = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                values.append((number, _bounded_loads(line)))
            except ValueError as err:
                raise TvmschedError(f"{path}, line {number}: not valid JSON ({one_line(err)})") from None
    return values


def _parse(path: Path, number: int, what: str, parse: Any) -> Any:
    """``parse()``, or TvmschedError naming the file and line when the entry is not what MetaSchedule writes."""
    try:
        return parse()
    except Exception as err:  # noqa: BLE001  (TVM raises its own types for malformed entries)
        raise TvmschedError(f"{path}, line {number}: not a MetaSchedule {what} ({one_line(err)})") from None


def import_ms_json(store: Any, work_dir: str | Path, *, units: int, unit_kind: str) -> dict[str, int]:
    """Copy a MetaSchedule JSON database into `store`, stamping records with `units`/`unit_kind`.

    Idempotent: importing twice adds nothing. Returns {"workloads": W, "records": R} (entries
    read, new or already present) and "new_records" (rows this call added).

    Both files are read and checked before anything is stored.

    Raises:
        FileNotFoundError: `work_dir` has no workload file.
        TvmschedError: a line is not JSON, or not a workload / record entry (file and line named).
    """
    work_dir = Path(work_dir)
    workload_path, record_path = work_dir / WORKLOAD_FILE, work_dir / RECORD_FILE
    if not workload_path.exists():
        raise FileNotFoundError(workload_path)
    parsed = [_parse(workload_path, n, "workload entry ([shash, base64])", lambda obj=obj: Workload.from_json(obj))
              for n, obj in _lines(workload_path)]
    records = _lines(record_path)
    for number, entry in records:  # [workload line index, [trace, run_secs, target, args_info]]
        _parse(record_path, number, "tuning record entry ([workload index, record])",
               lambda entry=entry: record_from_json(entry[1], parsed[_index(entry, len(parsed))]))
    db = TuningDatabase(store, units=units, unit_kind=unit_kind)
    before = store.stats()["records"]
    workloads = [db.commit_workload(workload.mod) for workload in parsed]
    for _, (index, record_json) in records:
        db.commit_tuning_record(record_from_json(record_json, workloads[index]))
    added = store.stats()["records"] - before
    log.info("imported %d workloads, %d records (%d new) from %s",
             len(workloads), len(records), added, work_dir)
    return {"workloads": len(workloads), "records": len(records), "new_records": added}


def _index(entry: Any, count: int) -> int:
    """The workload index of a record entry (ValueError unless a pair starting with an index below ``count``)."""
    if not isinstance(entry, list) or len(entry) != 2:
        raise ValueError("expected a [workload index, record] pair")
    index = entry[0]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise ValueError(f"workload index {index!r} is not one of the {count} workload lines")
    return index


def export_ms_json(store: Any, work_dir: str | Path) -> dict[str, int]:
    """Write every workload and record of `store` as a MetaSchedule JSON database in `work_dir`.

    Existing files are replaced. Workloads TVM cannot parse are skipped with their records.
    Returns {"workloads": W, "records": R} written.
    """
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    index: dict[int, int] = {}
    workload_lines = []
    for row in store.all_workloads():
        try:
            line = json.dumps(Workload(mod_from_json(row.mod_json)).as_json())
        except Exception:  # noqa: BLE001  (a foreign row must not stop the export)
            log.warning("skipping workload %d: not a TVM module", row.id)
            continue
        index[row.id] = len(workload_lines)
        workload_lines.append(line)
    record_lines = [
        json.dumps([index[r.workload_id], [json.loads(r.trace_json), r.run_secs,
                                           json.loads(r.target_json), json.loads(r.args_info_json)]])
        for r in store.all_records()
        if r.workload_id in index
    ]
    _write_lines(work_dir / WORKLOAD_FILE, workload_lines)
    _write_lines(work_dir / RECORD_FILE, record_lines)
    return {"workloads": len(workload_lines), "records": len(record_lines)}


def _write_lines(path: Path, lines: list[str]) -> None:
    """Replace `path` atomically with these lines."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, path)
