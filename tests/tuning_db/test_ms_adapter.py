"""TuningDatabase as MetaSchedule's database (real tiny tunes on SQLite and PostgreSQL), and the
import / export of MetaSchedule's own JSON database."""

from __future__ import annotations

import json

import pytest

from factories import LLVM_TARGET, add_relu_mod, matmul_mod, tiny_tune


def _replay(mod, trace_json: str):
    """The module obtained by applying a stored trace JSON to `mod` (independently of the adapter)."""
    import tvm

    sch = tvm.s_tir.Schedule(mod)
    tvm.s_tir.schedule.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return sch.mod


def _means(records) -> list[float]:
    return [sum(r.as_json()[1]) / len(r.as_json()[1]) for r in records]


def test_tune_into_sqlite_then_compile_tir_reads_the_best(tuned_sqlite):
    import tvm
    import tvm.s_tir.meta_schedule as ms
    import tvm_ffi

    from tvmsched.tuning_db import SQLStore, TuningDatabase

    url, mod = tuned_sqlite
    with SQLStore(url) as store:
        db = TuningDatabase(store)
        stats = store.stats()
        assert stats["workloads"] == 1 and stats["records"] >= 4
        assert len(db) == stats["records"] == len(db.get_all_tuning_records())
        records = store.all_records()
        assert all(r.units == 2 and r.unit_kind == "cpu_thread" for r in records)
        assert all(json.loads(r.target_json)["num-cores"] == 2 for r in records)
        valid = [r for r in records if r.mean_latency_s is not None]
        assert valid, "the tiny tune produced no valid record (builder or runner failures)"
        assert all(r.blocks is None or r.blocks >= 1 for r in records)

        best = store.top_k(valid[0].workload_id, 1)[0]
        assert best.mean_latency_s == min(r.mean_latency_s for r in valid)
        sch = ms.tir_integration.compile_tir(db, mod, tvm.target.Target(LLVM_TARGET))
        assert sch is not None
        record = db.query_tuning_record(mod, tvm.target.Target(LLVM_TARGET), "main")
        assert json.dumps(record.as_json()[0]) == best.trace_json
        assert tvm_ffi.structural_equal(sch.mod, _replay(mod, best.trace_json))
        ir_mod = db.query_ir_module(mod, tvm.target.Target(LLVM_TARGET), "main")
        assert tvm_ffi.structural_equal(ir_mod, _replay(mod, best.trace_json))
        tvm.compile(ir_mod, target=tvm.target.Target(LLVM_TARGET))  # the schedule builds


def test_second_database_on_the_same_file_sees_the_same_records(tuned_sqlite):
    from tvmsched.tuning_db import SQLStore, TuningDatabase

    url, mod = tuned_sqlite
    with SQLStore(url) as a, SQLStore(url) as b:
        db_a, db_b = TuningDatabase(a), TuningDatabase(b)
        assert len(db_a) == len(db_b) > 0
        traces_a = sorted(json.dumps(r.as_json()[0]) for r in db_a.get_all_tuning_records())
        traces_b = sorted(r.trace_json for r in b.all_records())
        assert traces_a == traces_b
        assert db_b.has_workload(mod)
        top = db_b.get_top_k(db_b.commit_workload(mod), 100)
        assert len(top) == len([r for r in b.all_records() if r.mean_latency_s is not None])
        assert _means(top) == sorted(_means(top))
        assert len(db_b.get_top_k(db_b.commit_workload(mod), 2)) == 2


def test_workloads_match_structurally_and_are_stored_once(tuned_sqlite):
    import tvm.s_tir.meta_schedule as ms

    from tvmsched.tuning_db import SQLStore, TuningDatabase
    from tvmsched.tuning_db.ms_adapter import workload_shash

    url, mod = tuned_sqlite
    with SQLStore(url) as store:
        db = TuningDatabase(store)
        rebuilt = matmul_mod()  # a new, structurally equal module
        assert db.has_workload(rebuilt) and not db.has_workload(matmul_mod(32))
        first = db.commit_workload(rebuilt)
        assert db.commit_workload(mod).same_as(first)
        assert store.stats()["workloads"] == 1
        row = store.all_workloads()[0]
        assert row.shash == workload_shash(mod) == ms.database.Workload(mod).as_json()[0]
        assert row.description == "main(A: float32[64,64], B: float32[64,64], C: float32[64,64])"


def test_scope_filters_lookups_by_units_and_target(tuned_sqlite):
    import tvm

    from tvmsched.tuning_db import SQLStore, TuningDatabase

    url, mod = tuned_sqlite
    llvm4 = {"kind": "llvm", "num-cores": 4}
    with SQLStore(url) as store:
        def top(**scope):
            db = TuningDatabase(store, **scope)
            return db.get_top_k(db.commit_workload(mod), 100)

        n_valid = len(top())
        assert n_valid > 0
        assert len(top(units=2)) == n_valid and top(units=1) == []
        assert len(top(target=LLVM_TARGET)) == n_valid and top(target=llvm4) == []
        assert top(target=tvm.target.Target(LLVM_TARGET), units=2) != []

        unscoped = TuningDatabase(store)
        assert unscoped.query_tuning_record(mod, tvm.target.Target("nvidia/nvidia-h100"), "main") is None
        # no record for 4 cores: an unscoped database falls back to the same target kind
        assert unscoped.query_tuning_record(mod, tvm.target.Target(llvm4), "main") is not None
        bound = TuningDatabase(store, target=llvm4)
        assert bound.query_schedule(mod, tvm.target.Target(llvm4), "main") is None
        assert unscoped.query_ir_module(matmul_mod(32), tvm.target.Target(LLVM_TARGET), "main") is None


def test_records_round_trip_through_the_store(store, tuned_ms_json):
    """Records from MetaSchedule's JSON database, committed and read back, rebuild the same schedule."""
    import tvm
    import tvm.s_tir.meta_schedule as ms
    import tvm_ffi

    from tvmsched.tuning_db import TuningDatabase

    work_dir, mod = tuned_ms_json
    originals = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False).get_all_tuning_records()
    assert originals
    db = TuningDatabase(store, units=7, unit_kind="gpu_sm")
    workload = db.commit_workload(mod)
    for rec in originals:
        db.commit_tuning_record(ms.database.TuningRecord(
            rec.trace, workload, rec.run_secs, rec.target, rec.args_info))
    assert len(db) == len(originals) and {r.units for r in store.all_records()} == {7}
    assert {r.unit_kind for r in store.all_records()} == {"gpu_sm"}

    fresh = TuningDatabase(type(store)(store.url))  # no cache: everything parsed from the store
    by_trace = {json.dumps(r.as_json()[0]): r for r in originals}
    for back in fresh.get_all_tuning_records():
        original = by_trace[json.dumps(back.as_json()[0])]
        assert back.as_json()[1:] == original.as_json()[1:]
        want = tvm.s_tir.Schedule(mod)
        original.trace.apply_to_schedule(want, remove_postproc=False)
        got = tvm.s_tir.Schedule(mod)
        back.trace.apply_to_schedule(got, remove_postproc=False)
        assert tvm_ffi.structural_equal(got.mod, want.mod)
    best = fresh.query_ir_module(mod, originals[0].target, "main")
    assert best is not None
    fresh.store.close()


def test_tune_into_postgresql(pg_url, tmp_path):
    import tvm
    import tvm.s_tir.meta_schedule as ms

    from tvmsched.tuning_db import open_database

    mod = add_relu_mod(512)
    db = open_database(pg_url, target=LLVM_TARGET)
    tiny_tune(mod, db, tmp_path / "work", trials=4)
    assert db.store.stats()["workloads"] == 1 and len(db) >= 1
    sch = ms.tir_integration.compile_tir(db, mod, tvm.target.Target(LLVM_TARGET))
    assert sch is not None
    again = open_database(pg_url)
    assert len(again) == len(db)
    assert again.query_ir_module(mod, tvm.target.Target(LLVM_TARGET), "main") is not None
    db.store.close()
    again.store.close()


def test_open_database_dispatch(tmp_path):
    from tvmsched.errors import TvmschedError
    from tvmsched.tuning_db import SQLStore, TuningDatabase, open_database

    db = open_database(f"sqlite:///{tmp_path / 'o.db'}", units=2, unit_kind="cpu_thread")
    assert isinstance(db, TuningDatabase) and isinstance(db.store, SQLStore)
    assert db.units == 2 and len(db) == 0
    db.store.close()
    with pytest.raises(TvmschedError, match="unsupported database URL"):
        open_database("redis://localhost/0")


# ---- MetaSchedule JSON database <-> store ----------------------------------------------------


def _traces(db) -> list[str]:
    return sorted(json.dumps(r.as_json()[0]) for r in db.get_all_tuning_records())


def test_import_export_round_trip(store, tuned_ms_json, tmp_path):
    import tvm
    import tvm.s_tir.meta_schedule as ms
    import tvm_ffi

    from tvmsched.tuning_db import export_ms_json, import_ms_json

    work_dir, mod = tuned_ms_json
    original = ms.database.JSONDatabase(work_dir=str(work_dir), allow_missing=False)
    n = len(original)
    assert n > 0

    counts = import_ms_json(store, work_dir, units=2, unit_kind="cpu_thread")
    assert counts == {"workloads": 1, "records": n, "new_records": n}
    assert store.stats() == {"workloads": 1, "records": n}
    again = import_ms_json(store, work_dir, units=2, unit_kind="cpu_thread")
    assert again["new_records"] == 0 and store.stats() == {"workloads": 1, "records": n}

    out = tmp_path / "exported"
    assert export_ms_json(store, out) == {"workloads": 1, "records": n}
    reloaded = ms.database.JSONDatabase(work_dir=str(out), allow_missing=False)
    assert len(reloaded) == n and _traces(reloaded) == _traces(original)
    assert sorted(json.dumps(r.as_json()[1:]) for r in reloaded.get_all_tuning_records()) == sorted(
        json.dumps(r.as_json()[1:]) for r in original.get_all_tuning_records()
    )
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    assert reloaded.has_workload(mod)
    best_back = reloaded.query_ir_module(mod, target, "main")
    best_orig = original.query_ir_module(mod, target, "main")
    assert best_back is not None and tvm_ffi.structural_equal(best_back, best_orig)

    # exporting again, then importing the export into the same store, adds nothing
    assert import_ms_json(store, out, units=2, unit_kind="cpu_thread")["new_records"] == 0


def test_import_of_a_missing_work_dir_fails(store, tmp_path):
    import pytest

    from tvmsched.tuning_db import import_ms_json

    with pytest.raises(FileNotFoundError):
        import_ms_json(store, tmp_path / "nothing", units=1, unit_kind="cpu_thread")


def test_export_skips_rows_that_are_not_tvm_modules(store, tmp_path):
    import tvm.s_tir.meta_schedule as ms

    from factories import synthetic_workloads
    from tvmsched.tuning_db import export_ms_json

    store.commit_workload(*synthetic_workloads(1)[0])
    assert export_ms_json(store, tmp_path) == {"workloads": 0, "records": 0}
    assert len(ms.database.JSONDatabase(work_dir=str(tmp_path), allow_missing=False)) == 0
