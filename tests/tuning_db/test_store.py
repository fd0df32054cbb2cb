"""SQLStore on SQLite and PostgreSQL: idempotent commits, top-k ordering and filters, errors."""

from __future__ import annotations

import json
import math

import pytest

from factories import synthetic_trace, synthetic_workloads

LLVM2 = json.dumps({"kind": "llvm", "num-cores": 2})
LLVM4 = json.dumps({"num-cores": 4, "kind": "llvm"})


def _record(store, workload_id, i, run_secs, *, target=LLVM2, units=2, blocks=None):
    return store.commit_record(
        workload_id, target_json=target, units=units, unit_kind="cpu_thread",
        trace_json=synthetic_trace(i), run_secs=run_secs, blocks=blocks, args_info_json="[]",
    )


def test_workload_commit_is_idempotent(store):
    shash, mod_json, desc = synthetic_workloads(1)[0]
    first = store.commit_workload(shash, mod_json, desc)
    again = store.commit_workload(shash, mod_json, "another description")
    assert again == first and first.description == desc
    assert store.find_workload(shash) == first
    assert store.find_workload(shash, mod_json) == first
    assert store.find_workload(shash, mod_json + " ") is None
    assert store.find_workload("nope") is None
    assert store.get_workload(first.id) == first and store.get_workload(first.id + 99) is None
    other = store.commit_workload(shash, mod_json + " ")  # same hash, other module text: a new row
    assert other.id != first.id and store.find_workload(shash) == first
    assert store.stats() == {"workloads": 2, "records": 0}


def test_record_commit_dedupes_on_unique_key(store):
    w = store.commit_workload(*synthetic_workloads(1)[0])
    first = _record(store, w.id, 1, [1e-3, 3e-3], blocks=8)
    assert first.mean_latency_s == pytest.approx(2e-3) and first.blocks == 8
    assert first.run_secs == [1e-3, 3e-3] and first.tool_version and "T" in first.created_at
    again = _record(store, w.id, 1, [5.0])  # same key: the stored row wins
    assert again == first
    # the key includes target, units and trace
    _record(store, w.id, 1, [1e-3], target=LLVM4, units=4)
    _record(store, w.id, 1, [1e-3], units=1)
    _record(store, w.id, 2, [1e-3])
    assert store.stats() == {"workloads": 1, "records": 4}
    assert [r.id for r in store.all_records()] == sorted(r.id for r in store.all_records())


def test_target_hash_is_canonical():
    from tvmsched.tuning_db.store import target_hash

    assert target_hash(LLVM2) == target_hash(json.dumps({"num-cores": 2, "kind": "llvm"}))
    assert target_hash(LLVM2) != target_hash(LLVM4)


def test_top_k_orders_and_filters(store):
    from tvmsched.tuning_db.store import target_hash

    w = store.commit_workload(*synthetic_workloads(1)[0])
    w2 = store.commit_workload(*synthetic_workloads(2)[1])
    _record(store, w.id, 1, [3e-3])
    _record(store, w.id, 2, [1e-3])
    _record(store, w.id, 3, [2e-3, 2e-3])
    _record(store, w.id, 4, [2e-3])  # ties with #3: the older row first
    _record(store, w.id, 5, [1e10])  # failed build: invalid
    _record(store, w.id, 6, [])  # never ran: invalid
    _record(store, w.id, 7, [5e-4], target=LLVM4, units=4)
    _record(store, w.id, 8, [4e-4], units=1)
    _record(store, w2.id, 9, [1e-5])
    means = [r.mean_latency_s for r in store.top_k(w.id, 10)]
    assert means == sorted(means) and len(means) == 6 and None not in means
    top = store.top_k(w.id, 10, target_hash=target_hash(LLVM2), units=2)
    assert [json.loads(r.trace_json)[0][0][2]["i"] for r in top] == [2, 3, 4, 1]
    assert [r.units for r in store.top_k(w.id, 10, units=4)] == [4]
    assert [r.units for r in store.top_k(w.id, 10, target_hash=target_hash(LLVM4))] == [4]
    assert len(store.top_k(w.id, 2)) == 2 and store.top_k(w.id, 0) == []
    assert store.top_k(w.id + 99, 5) == []


def test_invalid_runs_have_no_mean(store):
    w = store.commit_workload(*synthetic_workloads(1)[0])
    assert _record(store, w.id, 1, [1e10, 1e10]).mean_latency_s is None
    assert _record(store, w.id, 2, [float("inf"), float("nan")]).mean_latency_s is None
    mixed = _record(store, w.id, 3, [1e10, 2e-3])
    assert mixed.mean_latency_s == pytest.approx(2e-3) and math.isclose(mixed.run_secs[0], 1e10)
    assert [r.id for r in store.top_k(w.id, 5)] == [mixed.id]


def test_unknown_workload_raises_key_error_and_writes_nothing(store):
    with pytest.raises(KeyError):
        _record(store, 12345, 1, [1e-3])
    assert store.stats() == {"workloads": 0, "records": 0}


def test_reopen_keeps_data_and_migrations_are_idempotent(store):
    from tvmsched.tuning_db import SQLStore

    w = store.commit_workload(*synthetic_workloads(1)[0])
    _record(store, w.id, 1, [1e-3])
    with SQLStore(store.url) as again:
        assert again.stats() == {"workloads": 1, "records": 1}
        assert again.all_workloads() == store.all_workloads()


def test_open_store_dispatch(tmp_path, monkeypatch):
    from tvmsched.errors import TvmschedError
    from tvmsched.tuning_db import SQLStore, default_url, open_store

    s = open_store(f"sqlite:///{tmp_path / 'x' / 'y.db'}")  # missing folders are created
    assert isinstance(s, SQLStore) and s.stats() == {"workloads": 0, "records": 0}
    s.close()
    for bad in ("ftp://host/db", "mysql://u@h/db", "just-a-path.db"):
        with pytest.raises(TvmschedError, match="unsupported database URL"):
            open_store(bad)
    remote = open_store("http://127.0.0.1:9/", token="secret")  # the other helper's client; no I/O yet
    assert type(remote).__name__ == "RemoteStore"
    remote.close()
    with open_store("sqlite://") as memory:  # in-memory SQLite works too
        assert memory.stats() == {"workloads": 0, "records": 0}
    monkeypatch.setenv("TVMSCHED_DB", f"sqlite:///{tmp_path / 'env.db'}")
    assert default_url() == f"sqlite:///{tmp_path / 'env.db'}"
    with open_store() as env_store:
        assert env_store.url == default_url()


def test_sqlite_connections_use_wal_and_foreign_keys(tmp_path):
    from sqlalchemy import text

    from tvmsched.tuning_db import SQLStore

    with SQLStore(f"sqlite:///{tmp_path / 't.db'}") as s:
        with s._engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA foreign_keys")).scalar() == 1
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() >= 10_000


def test_a_schema_from_a_newer_version_is_a_clear_error(tmp_path):
    import sqlite3

    from tvmsched.errors import TvmschedError
    from tvmsched.tuning_db import SQLStore

    path = tmp_path / "future.db"
    SQLStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(TvmschedError, match="schema"):
        SQLStore(f"sqlite:///{path}")


def test_nul_characters_are_refused_the_same_on_both_backends(store):
    from tvmsched.errors import TvmschedError

    workload = store.commit_workload("1", "{}")
    with pytest.raises(TvmschedError, match="shash must not contain NUL"):
        store.commit_workload("1\x00", "{}")
    with pytest.raises(TvmschedError, match="description must not contain NUL"):
        store.commit_workload("2", "{}", "a\x00b")
    with pytest.raises(TvmschedError, match="shash must not contain NUL"):
        store.find_workload("\x00")
    with pytest.raises(TvmschedError, match="trace_json must not contain NUL"):
        store.commit_record(workload.id, target_json=LLVM2, units=2, unit_kind="cpu_thread", trace_json='"\x00"',
                            run_secs=[0.1], blocks=None, args_info_json="[]")
    with pytest.raises(TvmschedError, match="target_hash must not contain NUL"):
        store.top_k(workload.id, 1, target_hash="\x00")
    assert store.stats() == {"workloads": 1, "records": 0}


def test_a_file_that_is_not_a_database_or_a_malformed_url_is_a_clear_error(tmp_path):
    from tvmsched.errors import TvmschedError
    from tvmsched.tuning_db import SQLStore

    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n" * 100)
    expected = r"cannot open the tuning database sqlite:///.*notes.txt: file is not a database"
    with pytest.raises(TvmschedError, match=expected):
        SQLStore(f"sqlite:///{text_file}")
    assert text_file.read_text() == "not a database\n" * 100
    with pytest.raises(TvmschedError, match=r"malformed database URL 'postgresql\+psycopg://u:\*\*\*@h:port/db'"):
        SQLStore("postgresql+psycopg://u:secret@h:port/db")
