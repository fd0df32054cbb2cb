"""Four processes writing the same store at once: nothing lost, nothing duplicated, no lock errors."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from factories import concurrent_writer, real_workloads

WORKERS, RECORDS, SHARED = 4, 50, 20


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_concurrent_writers(backend, tmp_path, request):
    url = f"sqlite:///{tmp_path / 'shared.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    workloads = real_workloads()
    start_at = time.time() + 3.0  # most likely after every worker has imported its modules (if not: less overlap)
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS) as pool:
        results = pool.starmap_async(
            concurrent_writer,
            [(url, w, start_at, workloads, RECORDS, SHARED) for w in range(WORKERS)],
        ).get(timeout=900)  # a hang guard: each worker imports TVM, which a loaded 2-core machine does slowly

    errors = [e for r in results for e in r["errors"]]
    assert errors == [], "\n".join(errors)
    ids = {tuple(r["store_ids"]) for r in results} | {tuple(r["adapter_ids"]) for r in results}
    assert len(ids) == 1, f"workers saw different workload rows: {ids}"

    from tvmsched.tuning_db import SQLStore

    with SQLStore(url) as store:
        expected_records = SHARED + WORKERS * (RECORDS - SHARED)
        assert store.stats() == {"workloads": len(workloads), "records": expected_records}
        records = store.all_records()
        assert len({(r.workload_id, r.trace_json) for r in records}) == expected_records
        assert sorted(w.shash for w in store.all_workloads()) == sorted(w[0] for w in workloads)
        keys = {json.loads(r.trace_json)[0][0][2]["i"] for r in records}
        assert set(range(SHARED)) <= keys
