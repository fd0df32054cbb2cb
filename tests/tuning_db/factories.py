"""Shared test factories for the tuning database: tiny PrimFuncs, a tiny tune, store writers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tvmsched.tune import search as tuning

LLVM_TARGET = {"kind": "llvm", "num-cores": 2}


def matmul_mod(n: int = 64):
    """An IRModule holding one n x n x n float32 matmul PrimFunc named "main"."""
    import tvm
    from tvm import te

    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    func = te.create_prim_func([a, b, c]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def add_relu_mod(n: int = 256):
    """An IRModule holding one elementwise relu(x + y) PrimFunc of length n named "main"."""
    import tvm
    from tvm import te, topi

    x = te.placeholder((n,), name="X")
    y = te.placeholder((n,), name="Y")
    z = topi.nn.relu(topi.add(x, y))
    func = te.create_prim_func([x, y, z]).with_attr("global_symbol", "main")
    return tvm.IRModule({"main": func})


def tiny_tune(mod, database, work_dir: str | Path, *, trials: int = 8, target: dict | None = None) -> Any:
    """Tune `mod` on llvm with a tiny budget, committing into `database`; returns the database."""
    import tvm
    import tvm.s_tir.meta_schedule as ms

    strategy = ms.search_strategy.EvolutionarySearch(
        population_size=16, init_min_unmeasured=8, genetic_num_iters=1
    )
    runner = ms.runner.LocalRunner(
        evaluator_config=ms.runner.EvaluatorConfig(number=2, repeat=2, min_repeat_ms=0)
    )
    target = tvm.target.Target(target or LLVM_TARGET)
    with tuning.tensor_intrinsics(target), tuning.ms_logging_isolated():
        return ms.tune_tir(
            mod,
            target,
            str(work_dir),
            max_trials_global=trials,
            num_trials_per_iter=4,
            builder=tuning.make_builder(max_workers=1),
            runner=runner,
            database=database,
            cost_model="random",
            strategy=strategy,
            seed=0,
            num_tuning_cores=1,
        )


def synthetic_workloads(n: int = 3) -> list[tuple[str, str, str]]:
    """(shash, mod_json, description) triples of fake workloads for store-level tests."""
    return [
        (str(1000 + i), json.dumps({"fake_mod": i, "body": "x" * (10 + i)}), f"fake{i}")
        for i in range(n)
    ]


def synthetic_trace(i: int) -> str:
    """A distinct fake trace JSON text."""
    return json.dumps([[["SampleTile", [], {"i": i}, [i, 4]]], []])


def real_workloads() -> list[tuple[str, str, str]]:
    """(shash, TVM JSON, description) of three small real PrimFunc workloads."""
    from tvmsched.tuning_db.ms_adapter import describe, mod_to_json, workload_shash

    mods = [matmul_mod(16), matmul_mod(32), add_relu_mod(128)]
    return [(workload_shash(m), mod_to_json(m), describe(m)) for m in mods]


def concurrent_writer(
    url: str, worker: int, start_at: float, workloads: list[tuple[str, str, str]], n_records: int, shared: int
) -> dict[str, Any]:
    """Body of one writer process: open the store, commit every workload and `n_records` records.

    Records with index < `shared` are identical in every worker. Exceptions are returned, not
    raised, so the parent can assert there were none. Returns {"errors", "store_ids", "adapter_ids"}.
    """
    import time
    import traceback

    errors: list[str] = []
    out: dict[str, Any] = {"errors": errors, "store_ids": [], "adapter_ids": []}
    try:
        from tvmsched.tuning_db import SQLStore, TuningDatabase

        time.sleep(max(0.0, start_at - time.time()))
        store = SQLStore(url)  # concurrent first opens race on the migrations too
        out["store_ids"] = [store.commit_workload(*w).id for w in workloads]
        for i in range(n_records):
            key = i if i < shared else 1000 * (worker + 1) + i
            try:
                store.commit_record(
                    out["store_ids"][key % len(workloads)], target_json=json.dumps(LLVM_TARGET), units=2,
                    unit_kind="cpu_thread", trace_json=synthetic_trace(key),
                    run_secs=[1e-4 * (1 + key % 7)], blocks=key % 5 or None, args_info_json="[]",
                )
            except Exception:  # noqa: BLE001
                errors.append(traceback.format_exc())
        import tvm

        db = TuningDatabase(store)
        out["adapter_ids"] = [db._resolve(tvm.ir.load_json(w[1]), commit=True)[0] for w in workloads]
        store.close()
    except Exception:  # noqa: BLE001
        errors.append(traceback.format_exc())
    return out
