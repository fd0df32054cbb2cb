"""SQLStore: the tuning database on SQLite or PostgreSQL, through SQLAlchemy Core.

Every write is one transaction. Commits are idempotent on the tables' unique keys and safe under
concurrent writers: SQLite write transactions start with `BEGIN IMMEDIATE` (so a writer never has
to upgrade a read lock, the source of "database is locked" that `busy_timeout` cannot fix), and
inserts use `INSERT .. ON CONFLICT DO NOTHING` followed by a select of the winning row.

Both backends accept the same input: text with a NUL character (which PostgreSQL cannot store and
SQLite can) is refused with TvmschedError everywhere. A URL that cannot be parsed, or a database that
cannot be opened (not a database file, server unreachable), is a TvmschedError naming it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from ..errors import TvmschedError
from . import models
from .json_limits import loads as _bounded_loads

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 30_000
INVALID_RUN_SECS = 1e9  # MetaSchedule records failed runs as 1e10 seconds
_WRITE = "tvmsched_write"  # execution option: this transaction writes
_MIGRATION_LOCK = 0x7476_6D73  # PostgreSQL advisory lock key held while migrating

W = models.Workload.__table__
R = models.TuningRecord.__table__
C = models.Colocation.__table__


@dataclass(frozen=True)
class WorkloadRow:
    """A stored workload."""

    id: int
    shash: str
    mod_json: str
    description: str


@dataclass(frozen=True)
class RecordRow:
    """A stored tuning record."""

    id: int
    workload_id: int
    target_json: str
    target_hash: str
    units: int
    unit_kind: str
    trace_json: str
    run_secs: list[float]
    mean_latency_s: float | None
    blocks: int | None
    args_info_json: str
    created_at: str
    tool_version: str


def sha256_text(text: str) -> str:
    """Hex SHA-256 of a text's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def target_hash(target_json: str) -> str:
    """SHA-256 of the canonical form (sorted keys) of a target's JSON text (ValueError if not JSON)."""
    return sha256_text(json.dumps(_bounded_loads(target_json), sort_keys=True))


def _refuse_nul(**texts: str | None) -> None:
    """TvmschedError if a text holds a NUL character (PostgreSQL text cannot; refused on every backend)."""
    for name, value in texts.items():
        if value is not None and "\x00" in value:
            raise TvmschedError(f"{name} must not contain NUL (\\u0000) characters")


def redact_url(url: str) -> str:
    """``url`` with its password hidden (also when SQLAlchemy cannot parse it)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  (a malformed URL: hide whatever sits between "user:" and "@")
        return re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)


def _reason(err: BaseException) -> str:
    """The first line of a database error's own message, without SQLAlchemy's SQL and links."""
    cause = getattr(err, "orig", None) or err
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    return lines[0] if lines else type(cause).__name__


def mean_latency(run_secs: list[float]) -> float | None:
    """Mean of the valid run times (finite, below 1e9 s); None when there is none."""
    valid = [float(s) for s in run_secs if s is not None and math.isfinite(s) and 0 <= s < INVALID_RUN_SECS]
    return sum(valid) / len(valid) if valid else None


def _tool_version() -> str:
    from tvmsched import __version__

    return __version__


def _iso(value: datetime | str) -> str:
    """ISO text of a timestamp; SQLite hands back naive datetimes, which are UTC here."""
    if isinstance(value, str):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.isoformat()


def _workload_row(row: Any) -> WorkloadRow:
    return WorkloadRow(id=row.id, shash=row.shash, mod_json=row.mod_json, description=row.description)


def _record_row(row: Any) -> RecordRow:
    return RecordRow(
        id=row.id,
        workload_id=row.workload_id,
        target_json=row.target_json,
        target_hash=row.target_hash,
        units=row.units,
        unit_kind=row.unit_kind,
        trace_json=row.trace_json,
        run_secs=[float(s) for s in json.loads(row.run_secs_json)],
        mean_latency_s=row.mean_latency_s,
        blocks=row.blocks,
        args_info_json=row.args_info_json,
        created_at=_iso(row.created_at),
        tool_version=row.tool_version,
    )


def _sqlite_setup(engine: Engine) -> None:
    """WAL, busy timeout and foreign keys on every connection; BEGIN IMMEDIATE for writes."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # pysqlite must not emit BEGIN itself: the hook below does
        cursor = dbapi_conn.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_WRITE) else "BEGIN")


def make_engine(url: str) -> Engine:
    """An engine for a sqlite or postgresql URL (the SQLite file's folder is created).

    Raises:
        TvmschedError: a malformed URL, an unknown driver, or a SQLite folder that cannot be created.
    """
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "sqlite":
            if parsed.database and parsed.database != ":memory:" and not parsed.database.startswith("file:"):
                Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            engine = create_engine(parsed, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})
            _sqlite_setup(engine)
            return engine
        if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
            from tvmsched.extras import require

            require("db", f"the PostgreSQL database {redact_url(url)}")
        return create_engine(parsed, pool_pre_ping=True)
    except OSError as err:
        raise TvmschedError(f"cannot create the folder of the tuning database {redact_url(url)}: "
                            f"{err.strerror or err}") from None
    except (SQLAlchemyError, ValueError, TypeError) as err:  # ArgumentError, NoSuchModuleError, a bad port
        raise TvmschedError(f"malformed database URL {redact_url(url)!r}: {_reason(err)}") from None


def upgrade_schema(engine: Engine) -> None:
    """Run the alembic migrations to head in one locked transaction (concurrent callers queue)."""
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    from . import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent).replace("%", "%%"))
    with engine.execution_options(**{_WRITE: True}).begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
        config.attributes["connection"] = conn
        try:
            command.upgrade(config, "head")
        except CommandError as err:  # e.g. a revision written by a newer tvmsched
            raise TvmschedError(f"cannot upgrade the tuning database schema: {err}") from err


def _insert_ignore(conn: Connection, table: Any, values: dict[str, Any], keys: list[str]) -> None:
    """INSERT unless a row with the same unique `keys` exists (in this or a concurrent transaction)."""
    dialect = conn.dialect.name
    if dialect in ("sqlite", "postgresql"):
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        conn.execute(insert(table).values(**values).on_conflict_do_nothing(index_elements=keys))
        return
    try:
        with conn.begin_nested():
            conn.execute(table.insert().values(**values))
    except IntegrityError:
        pass


class SQLStore:
    """Workloads and tuning records in a SQL database (`sqlite:///...` or `postgresql+psycopg://...`)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine = make_engine(url)
        self._writer = self._engine.execution_options(**{_WRITE: True})
        try:
            upgrade_schema(self._engine)
        except SQLAlchemyError as err:  # not a database, unreachable, no such database, refused login, ...
            self._engine.dispose()
            raise TvmschedError(f"cannot open the tuning database {redact_url(url)}: {_reason(err)}") from err
        except BaseException:
            self._engine.dispose()
            raise
        log.debug("tuning database ready: %s", make_url(url).render_as_string(hide_password=True))

    def __repr__(self) -> str:
        return f"SQLStore({make_url(self.url).render_as_string(hide_password=True)!r})"

    def __enter__(self) -> SQLStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def commit_workload(self, shash: str, mod_json: str, description: str = "") -> WorkloadRow:
        """Store a workload unless present (same shash and JSON); return the stored row."""
        _refuse_nul(shash=shash, mod_json=mod_json, description=description)
        sha = sha256_text(mod_json)
        values = {"shash": shash, "mod_sha256": sha, "mod_json": mod_json, "description": description}
        with self._writer.begin() as conn:
            _insert_ignore(conn, W, values, ["shash", "mod_sha256"])
            row = conn.execute(select(W).where(W.c.shash == shash, W.c.mod_sha256 == sha)).one()
        return _workload_row(row)

    def find_workload(self, shash: str, mod_json: str | None = None) -> WorkloadRow | None:
        """The workload with this shash (and exactly this JSON, when given); the oldest one first."""
        _refuse_nul(shash=shash, mod_json=mod_json)
        query = select(W).where(W.c.shash == shash)
        if mod_json is not None:
            query = query.where(W.c.mod_sha256 == sha256_text(mod_json))
        with self._engine.connect() as conn:
            row = conn.execute(query.order_by(W.c.id).limit(1)).first()
        return None if row is None else _workload_row(row)

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        """The workload with this id, or None."""
        with self._engine.connect() as conn:
            row = conn.execute(select(W).where(W.c.id == workload_id)).first()
        return None if row is None else _workload_row(row)

    def commit_record(
        self,
        workload_id: int,
        *,
        target_json: str,
        units: int,
        unit_kind: str,
        trace_json: str,
        run_secs: list[float],
        blocks: int | None,
        args_info_json: str,
    ) -> RecordRow:
        """Store a tuning record unless present (same workload, target, units, trace); return it.

        Raises:
            KeyError: no workload has id `workload_id`.
            TvmschedError: a text holds a NUL character.
        """
        _refuse_nul(target_json=target_json, unit_kind=unit_kind, trace_json=trace_json, args_info_json=args_info_json)
        t_hash, trace_sha = target_hash(target_json), sha256_text(trace_json)
        run_secs = [float(s) for s in run_secs]
        values = {
            "workload_id": workload_id, "target_json": target_json, "target_hash": t_hash,
            "units": int(units), "unit_kind": unit_kind, "trace_json": trace_json,
            "trace_sha256": trace_sha, "run_secs_json": json.dumps(run_secs),
            "mean_latency_s": mean_latency(run_secs), "blocks": blocks,
            "args_info_json": args_info_json, "tool_version": _tool_version(),
        }
        key = (R.c.workload_id == workload_id, R.c.target_hash == t_hash, R.c.units == int(units),
               R.c.trace_sha256 == trace_sha)
        with self._writer.begin() as conn:
            if conn.execute(select(W.c.id).where(W.c.id == workload_id)).first() is None:
                raise KeyError(workload_id)
            _insert_ignore(conn, R, values, ["workload_id", "target_hash", "units", "trace_sha256"])
            row = conn.execute(select(R).where(*key)).one()
        return _record_row(row)

    def top_k(
        self, workload_id: int, k: int, *, target_hash: str | None = None, units: int | None = None
    ) -> list[RecordRow]:
        """The k fastest valid records of a workload (ties by id), optionally of one target / units."""
        if k <= 0:
            return []
        _refuse_nul(target_hash=target_hash)
        query = select(R).where(R.c.workload_id == workload_id, R.c.mean_latency_s.is_not(None))
        if target_hash is not None:
            query = query.where(R.c.target_hash == target_hash)
        if units is not None:
            query = query.where(R.c.units == units)
        query = query.order_by(R.c.mean_latency_s, R.c.id).limit(k)
        with self._engine.connect() as conn:
            return [_record_row(row) for row in conn.execute(query)]

    def all_records(self) -> list[RecordRow]:
        """Every record, oldest first."""
        with self._engine.connect() as conn:
            return [_record_row(row) for row in conn.execute(select(R).order_by(R.c.id))]

    def all_workloads(self) -> list[WorkloadRow]:
        """Every workload, oldest first."""
        with self._engine.connect() as conn:
            return [_workload_row(row) for row in conn.execute(select(W).order_by(W.c.id))]

    def stats(self) -> dict[str, int]:
        """Row counts: {"workloads": W, "records": R}."""
        with self._engine.connect() as conn:
            workloads = conn.execute(select(func.count()).select_from(W)).scalar_one()
            records = conn.execute(select(func.count()).select_from(R)).scalar_one()
        return {"workloads": int(workloads), "records": int(records)}

    def save_colocation(self, device: str, rows: list[dict[str, Any]]) -> int:
        """Replace the colocation profile of the pairs in `rows` on `device` (one transaction)."""
        with self._writer.begin() as conn:
            for row in rows:
                conn.execute(C.delete().where(C.c.device == device, C.c.first == row["first"], C.c.second == row["second"]))
                conn.execute(C.insert().values(
                    device=device, first=row["first"], second=row["second"], isolated_us=float(row["isolated_us"]),
                    colocated_us=float(row["colocated_us"]), overhead=float(row["overhead_per_unit_time"]),
                    created_at=models.utcnow(),
                ))
        return len(rows)

    def colocation(self, device: str) -> list[dict[str, Any]]:
        """The colocation profile of `device`, as profile-coloc rows."""
        with self._engine.connect() as conn:
            rows = conn.execute(select(C).where(C.c.device == device).order_by(C.c.id))
            return [{"first": r.first, "second": r.second, "isolated_us": r.isolated_us, "colocated_us": r.colocated_us,
                     "overhead_per_unit_time": r.overhead} for r in rows]

    def close(self) -> None:
        """Release the connection pool."""
        self._engine.dispose()


def open_store(url: str | None = None, token: str | None = None) -> Any:
    """The store behind a URL: SQLStore for sqlite / postgresql, RemoteStore for http(s).

    None means `settings.default_url()`; a bare `postgresql://` URL gets the psycopg driver.

    Raises:
        TvmschedError: any other URL scheme.
    """
    from ..errors import TvmschedError
    from .settings import default_url

    url = url or default_url()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        from tvmsched.extras import require

        require("db", f"the tuning database service {redact_url(url)}")
        from .client import RemoteStore

        return RemoteStore(url, token=token)
    if scheme in ("postgresql", "postgres"):
        url = "postgresql+psycopg:" + url.split(":", 1)[1]
        scheme = "postgresql+psycopg"
    if scheme == "sqlite" or scheme.startswith("sqlite+") or scheme.startswith("postgresql+"):
        return SQLStore(url)
    raise TvmschedError(
        f"unsupported database URL {url!r} (use sqlite:///PATH, postgresql+psycopg://... or http(s)://...)"
    )
