"""Concurrent writers: 4 spawned processes commit the same workloads and ~50 records each through one
service (uvicorn in a thread of this process) on SQLite and on PostgreSQL; nothing is lost or duplicated."""

from __future__ import annotations

import json
import multiprocessing
import queue
import random
import time
import traceback
from collections.abc import Iterator

import pytest

from live_service import serving
from tvmsched.tuning_db.client import RemoteStore
from tvmsched.tuning_db.store import SQLStore

TOKEN = "concurrency-token"
WORKERS = 4
WORKLOADS = 3
RECORDS_PER_WORKER = 50
SHARED = 20  # records every worker commits identically
TIME_LIMIT_S = 600  # a hang guard (4 spawned interpreters on a loaded 2-core machine take their time)


def _workloads() -> list[tuple[str, str, str]]:
    return [(str(7000 + i), json.dumps({"mod": i, "pad": "x" * 100}), f"w{i}") for i in range(WORKLOADS)]


def _record(key: str, latency: float) -> dict:
    return {
        "target_json": json.dumps({"kind": "llvm", "num-cores": 2}), "units": 2, "unit_kind": "cpu_thread",
        "trace_json": json.dumps({"key": key}), "run_secs": [latency, latency], "blocks": None,
        "args_info_json": "[]",
    }


def _plan(worker: int) -> list[tuple[int, str, float]]:
    """(workload index, record key, latency) this worker commits, in a worker-specific order."""
    plan = []
    for i in range(RECORDS_PER_WORKER):
        key = f"shared-{i}" if i < SHARED else f"w{worker}-{i}"
        latency = 0.001 * (1 + (i * 7919 + (0 if i < SHARED else worker)) % 97)
        plan.append((i % WORKLOADS, key, latency))
    random.Random(worker).shuffle(plan)
    return plan


def _worker(url: str, worker: int, barrier, results) -> None:
    """Commit the workloads and this worker's records; report ids or the traceback."""
    try:
        with RemoteStore(url, token=TOKEN) as store:
            barrier.wait(timeout=60)
            order = _workloads()[worker % WORKLOADS:] + _workloads()[: worker % WORKLOADS]
            rows = {w[0]: store.commit_workload(*w) for w in order}
            ids = [rows[shash].id for shash, _, _ in _workloads()]
            records = {key: store.commit_record(ids[w], **_record(key, s)).id for w, key, s in _plan(worker)}
        results.put({"worker": worker, "workloads": ids, "records": records, "error": None})
    except BaseException:  # reported to the test, which fails with it
        results.put({"worker": worker, "error": traceback.format_exc()})


@pytest.fixture()
def service(db_url: str) -> Iterator[tuple[str, SQLStore]]:
    """(URL, store) of a service over each backend, run by uvicorn in a thread; stopped at teardown."""
    with serving(db_url, token=TOKEN) as running:
        yield running


def test_concurrent_writers_lose_and_duplicate_nothing(service):
    url, store = service
    start = time.monotonic()
    results = _run_workers(url)
    elapsed = time.monotonic() - start

    errors = [r["error"] for r in results if r["error"]]
    assert not errors, "\n".join(errors)
    assert len(results) == WORKERS
    assert len({tuple(r["workloads"]) for r in results}) == 1  # everyone got the same workload rows
    for i in range(SHARED):  # identical records resolve to one row
        assert len({r["records"][f"shared-{i}"] for r in results}) == 1

    expected = {f"shared-{i}" for i in range(SHARED)}
    expected |= {f"w{w}-{i}" for w in range(WORKERS) for i in range(SHARED, RECORDS_PER_WORKER)}
    stored = [json.loads(r.trace_json)["key"] for r in store.all_records()]
    assert sorted(stored) == sorted(expected)  # none lost, none twice
    workloads = store.all_workloads()
    assert sorted((w.shash, w.mod_json) for w in workloads) == sorted((s, m) for s, m, _ in _workloads())
    assert store.stats() == {"workloads": WORKLOADS, "records": len(expected)}
    assert elapsed < TIME_LIMIT_S, f"took {elapsed:.1f} s"


def _run_workers(url: str) -> list[dict]:
    """Run WORKERS spawned processes against ``url`` at once; return their reports."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, w, barrier, results)) for w in range(WORKERS)]
    for proc in procs:
        proc.start()
    reports = []
    try:
        for _ in procs:
            reports.append(results.get(timeout=TIME_LIMIT_S * 2))
    except queue.Empty:
        pytest.fail(f"only {len(reports)} of {WORKERS} workers reported")
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return reports
