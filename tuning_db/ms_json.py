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

from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from .ms_adapter import TuningDatabase, mod_from_json

log = logging.getLogger(__name__)

WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"


def _lines(path: Path) -> list[Any]:
    """The JSON values of a file's non-empty lines ([] if the file is missing)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def import_ms_json(store: Any, work_dir: str | Path, *, units: int, unit_kind: str) -> dict[str, int]:
    """Copy a MetaSchedule JSON database into `store`, stamping records with `units`/`unit_kind`.

    Idempotent: importing twice adds nothing. Returns {"workloads": W, "records": R} (entries
    read, new or already present) and "new_records" (rows this call added).

    Raises:
        FileNotFoundError: `work_dir` has no workload file.
    """
    work_dir = Path(work_dir)
    if not (work_dir / WORKLOAD_FILE).exists():
        raise FileNotFoundError(work_dir / WORKLOAD_FILE)
    db = TuningDatabase(store, units=units, unit_kind=unit_kind)
    before = store.stats()["records"]
    workloads = [db.commit_workload(Workload.from_json(obj).mod) for obj in _lines(work_dir / WORKLOAD_FILE)]
    records = _lines(work_dir / RECORD_FILE)
    for index, record_json in records:
        db.commit_tuning_record(TuningRecord.from_json(record_json, workloads[index]))
    added = store.stats()["records"] - before
    log.info("imported %d workloads, %d records (%d new) from %s",
             len(workloads), len(records), added, work_dir)
    return {"workloads": len(workloads), "records": len(records), "new_records": added}


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
