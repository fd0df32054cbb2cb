"""Payloads of the tuning-database HTTP service (pydantic v2).

Request bodies are strict (no type coercion) and reject unknown fields; the ``*_json`` string fields
must hold valid JSON nested at most ``MAX_JSON_DEPTH`` levels. Query models are lax because query strings
are text. No string input may hold a NUL character: PostgreSQL text cannot store one (SQLite can), so it is
refused up front, the same on every backend.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, field_validator

from .json_limits import MAX_JSON_DEPTH as MAX_JSON_DEPTH  # the nesting limit of the *_json fields and bodies
from .json_limits import JSONTooDeep
from .json_limits import loads as _bounded_loads

MAX_SHASH_CHARS = 40  # the workloads.shash column (MetaSchedule hashes are uint64 decimals)
MAX_DESCRIPTION_CHARS = 4096
MAX_TARGET_JSON_CHARS = 64 * 1024
MAX_MOD_JSON_CHARS = 8 * 1024 * 1024
MAX_TRACE_JSON_CHARS = 4 * 1024 * 1024
MAX_ARGS_INFO_JSON_CHARS = 1024 * 1024
MAX_RUN_SECS = 1024
MAX_TOP_K = 100_000
MAX_INT32 = 2**31 - 1  # INTEGER columns on PostgreSQL
NO_NUL_PATTERN = r"^[^\x00]*$"  # documents the NUL check in the OpenAPI schema (ECMA, Python and Rust regex)


def _no_nul(value: str) -> str:
    """Refuse NUL characters (PostgreSQL text cannot hold them)."""
    if "\x00" in value:
        raise ValueError("must not contain NUL (\\u0000) characters")
    return value


def text(*, min_length: int | None = None, max_length: int, json_text: bool = False) -> type[str]:
    """A string input type: length-checked, then NUL refused (the schema's pattern documents the NUL check).

    ``json_text`` marks a string that holds JSON text (``contentMediaType: application/json`` in the schema;
    the model checks it with ``_check_json``).
    """
    schema: dict = {"pattern": NO_NUL_PATTERN}
    if json_text:
        schema["contentMediaType"] = "application/json"
    return Annotated[  # type: ignore[return-value]
        str,
        StringConstraints(min_length=min_length, max_length=max_length),
        AfterValidator(_no_nul),
        Field(json_schema_extra=schema),
    ]


UnitKind = Literal["gpu_sm", "gpu_sm_grid", "cpu_thread"]
Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
Shash = text(min_length=1, max_length=MAX_SHASH_CHARS)
RowId = Annotated[int, Field(ge=1, le=MAX_INT32)]


def _check_json(value: str | None) -> str | None:
    """Return ``value`` unchanged if it parses as JSON nested at most MAX_JSON_DEPTH deep (or is None)."""
    if value is None:
        return value
    try:
        _bounded_loads(value)
    except JSONTooDeep as err:
        raise ValueError(str(err)) from None
    except ValueError as err:
        raise ValueError(f"not valid JSON ({err})") from None
    return value


class _Body(BaseModel):
    """Base of request bodies: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid")


class _Out(BaseModel):
    """Base of responses: built from the store's dataclass rows."""

    model_config = ConfigDict(extra="forbid", from_attributes=True)


class WorkloadIn(_Body):
    """A workload to commit: MetaSchedule's structural hash plus the IRModule as TVM JSON."""

    shash: Shash
    mod_json: text(min_length=2, max_length=MAX_MOD_JSON_CHARS, json_text=True)
    description: text(max_length=MAX_DESCRIPTION_CHARS) = ""

    _json = field_validator("mod_json")(_check_json)


class WorkloadFind(_Body):
    """Find a workload by structural hash, optionally requiring the same module JSON."""

    shash: Shash
    mod_json: text(min_length=2, max_length=MAX_MOD_JSON_CHARS, json_text=True) | None = None

    _json = field_validator("mod_json")(_check_json)


class WorkloadOut(_Out):
    """A stored workload."""

    id: int
    shash: str
    mod_json: str
    description: str


class RecordIn(_Body):
    """A tuning record to commit for an existing workload."""

    workload_id: RowId
    target_json: text(min_length=2, max_length=MAX_TARGET_JSON_CHARS, json_text=True)
    units: int = Field(ge=0, le=1_000_000)
    unit_kind: UnitKind
    trace_json: text(min_length=2, max_length=MAX_TRACE_JSON_CHARS, json_text=True)
    run_secs: list[Seconds] = Field(max_length=MAX_RUN_SECS)
    blocks: int | None = Field(default=None, ge=0, le=MAX_INT32)
    args_info_json: text(min_length=2, max_length=MAX_ARGS_INFO_JSON_CHARS, json_text=True)

    _json = field_validator("target_json", "trace_json", "args_info_json")(_check_json)


class RecordOut(_Out):
    """A stored tuning record (``mean_latency_s`` is None for failed runs)."""

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

    @field_validator("mean_latency_s")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        """JSON has no NaN/inf: report a non-finite mean as unknown."""
        return value if value is None or math.isfinite(value) else None


class TopKQuery(BaseModel):
    """Query of ``GET /records/top``: the k fastest records of a workload, optionally scoped."""

    model_config = ConfigDict(extra="forbid")

    workload_id: RowId
    k: int = Field(ge=0, le=MAX_TOP_K)
    target_hash: text(min_length=1, max_length=64) | None = None
    units: int | None = Field(default=None, ge=0, le=MAX_INT32)


class LookupQuery(BaseModel):
    """Query of ``GET /workloads/lookup``."""

    model_config = ConfigDict(extra="forbid")

    shash: Shash


class Stats(_Out):
    """Row counts."""

    workloads: int
    records: int


class Health(_Out):
    """Liveness answer."""

    status: Literal["ok"] = "ok"
    version: str
    backend: str
    auth: bool = Field(description="whether writes need a bearer token")


# --- error answers (what the service sends; the OpenAPI document describes them with these) -----------


class ErrorOut(_Out):
    """An error answer: what went wrong, in one line."""

    detail: str


class FieldError(_Out):
    """One problem with a request: where (``["body", "trace_json"]``, ``["query", "k"]``), what, and its kind."""

    loc: list[str | int]
    msg: str
    type: str


class ValidationErrorOut(_Out):
    """A 422 answer: the first problems in one line, and all of them (the input is never echoed back)."""

    detail: str
    errors: list[FieldError]
