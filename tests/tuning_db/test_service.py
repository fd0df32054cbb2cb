"""The tuning-database HTTP service, run for real: `serve()` in a subprocess on 127.0.0.1, SQLite in tmp."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from tvmsched.errors import TvmschedError
from tvmsched.tuning_db import client as client_module
from tvmsched.tuning_db.client import RemoteDatabase, RemoteStore
from tvmsched.tuning_db.service import DEFAULT_MAX_BODY_BYTES, create_app, read_token, serve
from tvmsched.tuning_db.store import SQLStore, target_hash

TOKEN = "s3cret-token-for-tests"
START_TIMEOUT_S = 300  # a hang guard: the loop ends when the service answers
CPU_TARGET = json.dumps({"kind": "llvm", "num-cores": 2})
GPU_TARGET = json.dumps({"kind": "cuda", "arch": "sm_90"})
PATHS = {
    "/health", "/stats", "/workloads", "/workloads/lookup", "/workloads/find",
    "/workloads/{workload_id}", "/records", "/records/top",
}


# --- a real server --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def running_service(db_url: str, log_path: Path, token_file: Path | None = None) -> Iterator[str]:
    """Run `serve(db_url, ...)` in a subprocess; yield its base URL; stop it on exit."""
    port = free_port()
    token_path = str(token_file) if token_file else None
    code = (
        "from tvmsched.tuning_db.service import serve; "
        f"serve({db_url!r}, port={port}, token_file={token_path!r}, log_level='warning')"
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url, log_path)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_healthy(proc: subprocess.Popen, url: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the service exited with {proc.returncode}:\n{log_path.read_text()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        time.sleep(0.1)
    pytest.fail(f"the service did not start within {START_TIMEOUT_S} s:\n{log_path.read_text()}")


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """(service URL, database URL) of one token-protected service for this module."""
    tmp = tmp_path_factory.mktemp("service")
    db_url = f"sqlite:///{tmp / 'tuning.db'}"
    SQLStore(db_url).close()  # create the schema before the service opens it
    token_file = tmp / "token"
    token_file.write_text(f"  {TOKEN}\n")
    token_file.chmod(0o600)
    with running_service(db_url, tmp / "service.log", token_file) as url:
        yield url, db_url
    log = (tmp / "service.log").read_text()
    assert "Traceback" not in log, log  # no request crashed a handler


@pytest.fixture()
def remote(service) -> Iterator[RemoteStore]:
    with RemoteStore(service[0], token=TOKEN) as store:
        yield store


@pytest.fixture()
def local(service) -> Iterator[SQLStore]:
    store = SQLStore(service[1])
    yield store
    store.close()


def record_fields(i: int, *, units: int = 2, secs: float | None = None) -> dict:
    """Keyword arguments of commit_record for a distinct fake record number ``i``."""
    return {
        "target_json": CPU_TARGET, "units": units, "unit_kind": "cpu_thread",
        "trace_json": json.dumps({"insts": [], "decisions": [i]}),
        "run_secs": [secs if secs is not None else 0.001 * (i + 1)] * 2,
        "blocks": None, "args_info_json": json.dumps([["TENSOR", "float32", [4], i]]),
    }


# --- reads, writes, equivalence with SQLStore -----------------------------------------------------


def test_health_and_stats(service, remote, local):
    answer = httpx.get(f"{service[0]}/health").json()
    assert answer["status"] == "ok" and answer["auth"] is True and answer["backend"] == "sqlite"
    assert "tuning.db" not in json.dumps(answer)  # never the database URL
    assert remote.stats() == local.stats()
    assert set(httpx.get(f"{service[0]}/stats").json()) == {"workloads", "records"}


def test_openapi_and_docs_are_served(service):
    spec = httpx.get(f"{service[0]}/openapi.json").json()
    assert PATHS <= set(spec["paths"])
    assert "post" in spec["paths"]["/records"] and "get" in spec["paths"]["/records/top"]
    docs = httpx.get(f"{service[0]}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_workload_commit_is_idempotent(service, remote, local):
    before = local.stats()["workloads"]
    first = remote.commit_workload("111", '{"mod": 1}', "first")
    again = remote.commit_workload("111", '{"mod": 1}', "first")
    assert first == again
    assert local.stats()["workloads"] == before + 1
    assert remote.find_workload("111") == first == remote.find_workload("111", '{"mod": 1}')
    assert remote.find_workload("111", '{"mod": 2}') is None
    assert remote.find_workload("999999") is None
    assert remote.get_workload(first.id) == first == local.get_workload(first.id)
    assert remote.get_workload(10**9) is None
    assert first in remote.all_workloads()
    body = {"shash": "111", "mod_json": '{"mod": 1}', "description": "first"}
    answer = httpx.post(f"{service[0]}/workloads", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 200 and answer.json()["id"] == first.id
    body["shash"] = "112"
    answer = httpx.post(f"{service[0]}/workloads", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 201


def test_records_and_top_k_match_sqlstore(remote, local):
    workload = remote.commit_workload("222", '{"mod": 2}')
    secs = [0.005, 0.001, 0.003, 0.002, 0.004]
    rows = [remote.commit_record(workload.id, **record_fields(i, secs=s)) for i, s in enumerate(secs)]
    remote.commit_record(workload.id, **record_fields(10, units=1, secs=0.0005))
    gpu = {"target_json": GPU_TARGET, "units": 8, "unit_kind": "gpu_sm", "blocks": 64}
    remote.commit_record(workload.id, **{**record_fields(11, secs=0.0001), **gpu})
    assert remote.commit_record(workload.id, **record_fields(0, secs=0.005)) == rows[0]  # idempotent

    cpu_hash, gpu_hash = target_hash(CPU_TARGET), target_hash(GPU_TARGET)
    scopes = [{}, {"units": 2}, {"units": 1}, {"target_hash": cpu_hash}, {"target_hash": gpu_hash, "units": 8}]
    for scope in scopes:
        for k in (1, 3, 100):
            assert remote.top_k(workload.id, k, **scope) == local.top_k(workload.id, k, **scope), (scope, k)
    top = remote.top_k(workload.id, 3, target_hash=cpu_hash, units=2)
    assert [r.mean_latency_s for r in top] == pytest.approx([0.001, 0.002, 0.003])
    assert remote.top_k(workload.id, 0) == []
    mine = [r for r in remote.all_records() if r.workload_id == workload.id]
    assert mine == [r for r in local.all_records() if r.workload_id == workload.id]
    assert len(mine) == 7


def test_commit_record_for_unknown_workload_raises_keyerror(remote):
    with pytest.raises(KeyError):
        remote.commit_record(10**9, **record_fields(0))


# --- the token ------------------------------------------------------------------------------------


def test_writes_need_the_token_reads_do_not(service, local):
    url = service[0]
    before = local.stats()
    body = {"shash": "333", "mod_json": "{}", "description": ""}
    assert httpx.post(f"{url}/workloads", json=body).status_code == 401
    wrong = httpx.post(f"{url}/workloads", json=body, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    basic = httpx.post(f"{url}/workloads", json=body, headers={"Authorization": f"Basic {TOKEN}"})
    assert basic.status_code == 401
    for token in (None, "nope"):
        with RemoteStore(url, token=token) as stranger, pytest.raises(TvmschedError, match="needs a valid token"):
            stranger.commit_workload("333", "{}")
    assert local.stats() == before
    with RemoteStore(url) as anonymous:  # reads are open
        assert anonymous.stats() == before
        assert anonymous.find_workload("333") is None
        assert isinstance(anonymous.all_records(), list)
    with RemoteStore(url, token=TOKEN) as writer:
        assert writer.commit_workload("333", "{}").shash == "333"


def test_token_file_must_exist_and_not_be_empty(tmp_path):
    with pytest.raises(TvmschedError, match="cannot read the token file"):
        serve(f"sqlite:///{tmp_path / 'x.db'}", port=free_port(), token_file=str(tmp_path / "missing"))
    (tmp_path / "empty").write_text(" \n")
    with pytest.raises(TvmschedError, match="is empty"):
        serve(f"sqlite:///{tmp_path / 'x.db'}", port=free_port(), token_file=str(tmp_path / "empty"))
    (tmp_path / "ok").write_text("abc\n")
    assert read_token(tmp_path / "ok") == "abc"
    assert not (tmp_path / "x.db").exists()  # refused before opening the database


def test_unreachable_service_is_a_clear_error():
    with RemoteStore(f"http://127.0.0.1:{free_port()}", retries=1) as store:
        with pytest.raises(TvmschedError, match="cannot reach the tuning-database service at http://127"):
            store.stats()


class _BrokenStore:
    """A store whose reads fail unexpectedly and whose writes find the database down."""

    url = "sqlite:///broken.db"

    def stats(self):
        raise RuntimeError("disk on fire")

    def find_workload(self, shash, mod_json=None):
        raise OperationalError("SELECT", {}, Exception("database is locked"))


def test_store_failures_become_500_or_503_and_the_app_keeps_answering():
    async def ask() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(_BrokenStore()))
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as client:
            return [
                await client.get("/stats"),
                await client.post("/workloads/find", json={"shash": "1"}),
                await client.get("/health"),
            ]

    broken, locked, health = asyncio.run(ask())
    assert broken.status_code == 500 and "RuntimeError" in broken.json()["detail"]
    assert locked.status_code == 503 and "unavailable" in locked.json()["detail"]
    assert health.status_code == 200


def test_client_retries_503_then_reports_the_detail(monkeypatch):
    monkeypatch.setattr(client_module, "RETRY_BACKOFF_S", 0.0)
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= 2:
            return httpx.Response(503, json={"detail": "busy"})
        return httpx.Response(200, json={"workloads": 1, "records": 2})

    store = RemoteStore("http://tuning:8765", transport=httpx.MockTransport(handler), retries=2)
    assert store.stats() == {"workloads": 1, "records": 2} and len(calls) == 3
    calls.clear()
    store.retries = 1
    with pytest.raises(TvmschedError, match="answered 503: busy"):
        store.stats()


# --- bad input ------------------------------------------------------------------------------------


def _bad_requests(workload_id: int) -> list[tuple[str, str, dict, int]]:
    """(method, path, httpx kwargs, expected status) of requests the service must refuse."""
    good = {"workload_id": workload_id, **record_fields(99)}
    json_headers = {"Content-Type": "application/json"}
    nan_body = json.dumps({**good, "run_secs": [float("nan")]}).encode()
    oversized = json.dumps({**good, "trace_json": json.dumps(["x" * DEFAULT_MAX_BODY_BYTES])})

    def chunks():
        for _ in range(DEFAULT_MAX_BODY_BYTES // 65536 + 2):
            yield b" " * 65536

    return [
        ("POST", "/records", {"content": b'{"workload_id": 1,', "headers": json_headers}, 422),
        ("POST", "/workloads", {"content": b"not json at all", "headers": json_headers}, 422),
        ("POST", "/records", {"json": [1, 2, 3]}, 422),
        ("POST", "/records", {"json": {**good, "units": "2"}}, 422),
        ("POST", "/records", {"json": {**good, "units": 2.0}}, 422),
        ("POST", "/records", {"json": {**good, "run_secs": "fast"}}, 422),
        ("POST", "/records", {"json": {**good, "units": -1}}, 422),
        ("POST", "/records", {"json": {**good, "unit_kind": "tpu_core"}}, 422),
        ("POST", "/records", {"json": {**good, "trace_json": "{not json"}}, 422),
        ("POST", "/records", {"json": {**good, "run_secs": [0.1] * 5000}}, 422),
        ("POST", "/records", {"content": nan_body, "headers": json_headers}, 422),
        ("POST", "/records", {"json": {**good, "surprise": 1}}, 422),
        ("POST", "/records", {"json": {k: v for k, v in good.items() if k != "trace_json"}}, 422),
        ("POST", "/workloads", {"json": {"shash": 5, "mod_json": "{}"}}, 422),
        ("POST", "/workloads", {"json": {"shash": "5", "mod_json": "{}", "extra": True}}, 422),
        ("POST", "/workloads", {"json": {"shash": "5" * 100, "mod_json": "{}"}}, 422),
        ("POST", "/records", {"content": oversized.encode(), "headers": json_headers}, 413),
        ("POST", "/workloads", {"content": chunks(), "headers": json_headers}, 413),
        ("POST", "/records", {"json": {**good, "workload_id": 10**9}}, 404),
        ("GET", "/records/top", {"params": {"workload_id": workload_id, "k": -1}}, 422),
        ("GET", "/records/top", {"params": {"workload_id": workload_id, "k": "many"}}, 422),
        ("GET", "/records/top", {"params": {"workload_id": workload_id}}, 422),
        ("GET", "/records/top", {"params": {"workload_id": workload_id, "k": 1, "bogus": 1}}, 422),
        ("GET", "/workloads/lookup", {}, 422),
        ("GET", "/workloads/0", {}, 422),
    ]


def test_bad_requests_are_refused_and_change_nothing(service, remote, local):
    url = service[0]
    workload = remote.commit_workload("444", '{"mod": 4}')
    before = local.stats()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for method, path, kwargs, expected in _bad_requests(workload.id):
        kwargs = {**kwargs, "headers": {**headers, **kwargs.get("headers", {})}}
        answer = httpx.request(method, f"{url}{path}", timeout=30, **kwargs)
        assert answer.status_code == expected, (method, path, answer.text[:300])
        detail = answer.json()["detail"]
        assert isinstance(detail, str) and detail, answer.text[:300]
        assert len(answer.content) < 20_000  # the input is never echoed back
        assert httpx.get(f"{url}/health").status_code == 200
    assert local.stats() == before == remote.stats()


# --- MetaSchedule through the service -------------------------------------------------------------


def test_metaschedule_tunes_through_the_service(service, local, tmp_path):
    import tvm
    import tvm.s_tir.meta_schedule as ms

    from factories import LLVM_TARGET, matmul_mod, tiny_tune
    from tvmsched.tuning_db.ms_adapter import TuningDatabase

    url, _ = service
    mod = matmul_mod(32)
    before, known = local.stats(), {w.id for w in local.all_workloads()}
    with RemoteStore(url, token=TOKEN) as remote:
        database = TuningDatabase(remote)
        tiny_tune(mod, database, tmp_path / "work", trials=8)
        target = tvm.target.Target(LLVM_TARGET)
        scheduled = ms.tir_integration.compile_tir(database, mod, target)
        assert scheduled is not None
        assert len(database) > 0
    after = local.stats()
    assert after["workloads"] == before["workloads"] + 1
    assert after["records"] > before["records"]
    (new_id,) = {w.id for w in local.all_workloads()} - known
    fresh = [r for r in local.all_records() if r.workload_id == new_id]
    assert fresh and any(r.mean_latency_s is not None for r in fresh)
    tvm.compile(scheduled.mod, target=target)  # the scheduled module builds


def test_remote_database_and_open_database_use_the_service(service, local):
    from tvmsched.tuning_db.ms_adapter import TuningDatabase, open_database

    url, _ = service
    for database in (RemoteDatabase(url, TOKEN, units=2), open_database(url, token=TOKEN)):
        assert isinstance(database, TuningDatabase) and isinstance(database.store, RemoteStore)
        assert len(database) == local.stats()["records"]
