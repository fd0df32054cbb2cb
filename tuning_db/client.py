"""RemoteStore: the SQLStore interface over the tuning-database HTTP service.

``TuningDatabase(RemoteStore(url, token=...))`` lets MetaSchedule on any machine read and write the
shared database; ``RemoteDatabase(url, token)`` is the same in one call. Every request is idempotent,
so transport failures and 503 answers are retried a few times.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import httpx

from tvmsched.errors import TvmschedError, one_line
from tvmsched.tuning_db.schemas import MAX_INT32, MAX_TOP_K
from tvmsched.tuning_db.store import RecordRow, WorkloadRow

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0
DEFAULT_RETRIES = 3
RETRY_BACKOFF_S = 0.2
RETRY_STATUS = frozenset({502, 503, 504})


class _NotFound(TvmschedError):
    """A 404 answer; lookups turn it into None, commit_record into KeyError."""


class RemoteStore:
    """SQLStore's methods over HTTP (see ``tvmsched.tuning_db.service``).

    Args:
        url: base URL of the service, e.g. ``http://tuning-host:8765``.
        token: the service's bearer token, sent on writes (None if the service has none).
        timeout: seconds to wait for an answer (connecting waits at most CONNECT_TIMEOUT_S).
        retries: extra attempts after a transport error or a 502/503/504 answer.
        transport: an httpx transport to use instead of the network (tests).
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = DEFAULT_RETRIES,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(
            base_url=self.url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(keepalive_expiry=2.0),
            transport=transport,
            headers={"User-Agent": "tvmsched-remote-store"},
        )

    def __repr__(self) -> str:
        return f"RemoteStore({self.url!r})"

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- workloads ---

    def commit_workload(self, shash: str, mod_json: str, description: str = "") -> WorkloadRow:
        """Commit a workload (idempotent) and return its row."""
        body = {"shash": shash, "mod_json": mod_json, "description": description}
        return _workload(self._request("POST", "/workloads", json=body, write=True))

    def find_workload(self, shash: str, mod_json: str | None = None) -> WorkloadRow | None:
        """The workload with ``shash`` (and the same module JSON, when given), or None."""
        try:
            if mod_json is None:
                return _workload(self._request("GET", "/workloads/lookup", params={"shash": shash}))
            body = {"shash": shash, "mod_json": mod_json}
            return _workload(self._request("POST", "/workloads/find", json=body))
        except _NotFound:
            return None

    def get_workload(self, workload_id: int) -> WorkloadRow | None:
        """The workload with id ``workload_id``, or None."""
        if not 1 <= workload_id <= MAX_INT32:
            return None
        try:
            return _workload(self._request("GET", f"/workloads/{int(workload_id)}"))
        except _NotFound:
            return None

    def all_workloads(self) -> list[WorkloadRow]:
        """All workloads."""
        return [_workload(item) for item in self._request("GET", "/workloads")]

    # --- records ---

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
        """Commit a tuning record (idempotent); KeyError if the workload is unknown."""
        if not 1 <= workload_id <= MAX_INT32:
            raise KeyError(workload_id)
        body = {
            "workload_id": workload_id, "target_json": target_json, "units": units, "unit_kind": unit_kind,
            "trace_json": trace_json, "run_secs": [float(s) for s in run_secs], "blocks": blocks,
            "args_info_json": args_info_json,
        }
        try:
            return _record(self._request("POST", "/records", json=body, write=True))
        except _NotFound:
            raise KeyError(workload_id) from None

    def top_k(
        self, workload_id: int, k: int, *, target_hash: str | None = None, units: int | None = None
    ) -> list[RecordRow]:
        """The ``k`` fastest valid records of a workload, optionally for one target hash / unit count."""
        if k <= 0 or not 1 <= workload_id <= MAX_INT32:
            return []
        params: dict[str, Any] = {"workload_id": workload_id, "k": min(k, MAX_TOP_K)}
        if target_hash is not None:
            params["target_hash"] = target_hash
        if units is not None:
            params["units"] = units
        return [_record(item) for item in self._request("GET", "/records/top", params=params)]

    def all_records(self) -> list[RecordRow]:
        """All records."""
        return [_record(item) for item in self._request("GET", "/records")]

    def stats(self) -> dict[str, int]:
        """``{"workloads": W, "records": R}``."""
        data = self._request("GET", "/stats")
        return {"workloads": int(data["workloads"]), "records": int(data["records"])}

    def health(self) -> dict[str, Any]:
        """The service's ``/health`` answer."""
        return self._request("GET", "/health")

    def close(self) -> None:
        """Close the HTTP connections."""
        self._client.close()

    # --- transport ---

    def _request(self, method: str, path: str, *, write: bool = False, **kwargs: Any) -> Any:
        """Send one request (retrying transport errors and 502/503/504) and return the JSON answer."""
        headers = self._auth if write else {}
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._client.request(method, path, headers=headers, **kwargs)
            except httpx.TransportError as err:
                if last:
                    message = f"cannot reach the tuning-database service at {self.url}: {one_line(err)}"
                    raise TvmschedError(message) from None
                log.debug("%s %s: %s; retrying", method, path, err)
            else:
                if response.status_code not in RETRY_STATUS or last:
                    return self._answer(response)
                log.debug("%s %s: %d; retrying", method, path, response.status_code)
            time.sleep(RETRY_BACKOFF_S * 2**attempt)
        raise AssertionError("unreachable")

    def _answer(self, response: httpx.Response) -> Any:
        """The JSON body of a 2xx answer; the matching exception otherwise."""
        code = response.status_code
        if code < 300:
            try:
                return response.json()
            except ValueError:
                raise self._unexpected("an answer that is not JSON") from None
        detail = _detail(response)
        if code == 401:
            message = f"the tuning-database service at {self.url} needs a valid token (--token-file)"
            raise TvmschedError(message)
        if code == 404:
            raise _NotFound(f"the tuning-database service at {self.url} answered 404: {detail}")
        raise TvmschedError(f"the tuning-database service at {self.url} answered {code}: {detail}")

    def _unexpected(self, what: str) -> TvmschedError:
        return TvmschedError(f"{self.url} sent {what}: is it a tvmsched tuning-database service?")


def _detail(response: httpx.Response) -> str:
    """The service's ``detail`` message, or the start of the body."""
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    if detail is None:
        detail = response.text[:200] or response.reason_phrase
    return detail if isinstance(detail, str) else str(detail)[:500]


def _pick(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The fields of dataclass ``cls`` from ``data`` (ignoring fields a newer service may add)."""
    names = [field.name for field in dataclasses.fields(cls)]
    if not isinstance(data, dict) or not all(name in data for name in names):
        raise TvmschedError(f"the tuning-database service sent an unexpected answer for a {cls.__name__}")
    return {name: data[name] for name in names}


def _workload(data: dict[str, Any]) -> WorkloadRow:
    return WorkloadRow(**_pick(WorkloadRow, data))


def _record(data: dict[str, Any]) -> RecordRow:
    fields = _pick(RecordRow, data)
    fields["run_secs"] = list(fields["run_secs"])
    return RecordRow(**fields)


def RemoteDatabase(url: str, token: str | None = None, **scope: Any):  # noqa: N802 (named like a class)
    """A MetaSchedule database over the service at ``url``: ``TuningDatabase(RemoteStore(url, token))``.

    ``scope`` (units, unit_kind, target) goes to TuningDatabase.
    """
    from tvmsched.tuning_db.ms_adapter import TuningDatabase

    return TuningDatabase(RemoteStore(url, token=token), **scope)
