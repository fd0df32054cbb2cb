"""Grid limiting (restricting a GPU kernel to ~k SMs without green contexts) and its path through a kit."""

import pytest
import tvm
from tvm.script import tirx as T

from tvmsched import models
from tvmsched.tune.kit_build import build_kit, import_results
from tvmsched.passes.grid_limit import grid_limit
from tvmsched.pipeline import compile_model
from tvmsched.lower.targets import make_target


@T.prim_func(s_tir=True)
def add_one(A: T.Buffer((100000,), "float32"), B: T.Buffer((100000,), "float32")):
    for bx in T.thread_binding(391, thread="blockIdx.x"):
        for tx in T.thread_binding(256, thread="threadIdx.x"):
            with T.sblock("b"):
                vi = T.axis.spatial(100000, bx * 256 + tx)
                T.where(bx * 256 + tx < 100000)
                B[vi] = A[vi] + T.float32(1)


def test_grid_is_limited_to_the_blocks_k_sms_hold_and_blocks_loop_over_the_rest():
    limited, extent = grid_limit(add_one, 4, sm_max_threads=2048, sm_max_blocks=32)
    assert extent == 4 * (2048 // 256)  # 32 blocks, each looping over ceil(391 / 32) = 13 rounds
    script = limited.script()
    assert 'T.thread_binding(32, thread="blockIdx.x")' in script and "bx_iter in range(13)" in script
    assert "T.thread_return()" in script  # 13 x 32 = 416 > 391: the last round overhangs
    target = make_target("cuda")
    with target:
        executable = tvm.compile(tvm.IRModule({"main": limited.with_attr("global_symbol", "main")}), target)
    source = executable.mod.imports[0].inspect_source()
    assert "bx_iter < 13" in source or "bx_iter < (int64_t)13" in source and "return;" in source


def test_a_grid_that_already_fits_is_left_alone():
    assert grid_limit(add_one, 64)[1] is None  # 64 SMs x 8 blocks = 512 >= 391


@pytest.mark.slow
def test_grid_limited_kit_records_become_grid_limited_candidates(tmp_path):
    """The kit's CUDA samples, each also grid-limited to 1 and 2 SMs, built here (what the kit is; ~20-40 s on 2 cores:
    sampling loads TVM's tensor intrinsics, and nvcc compiles where the CUDA runtime is enabled)."""
    model = models.build("mlp")
    kit = build_kit(model, tmp_path / "kit", target="cuda", samples=2, grid_limit_units=[1, 2], progress=False)
    assert kit["mechanism"] == "grid_limit" and kit["grid_limit_units"] == [1, 2]
    sample = kit["funcs"][0]["samples"][0]
    assert set(sample["grid_limited"]) == {"1", "2"}
    # timings as `tvmsched tune measure` reports them (this test has no GPU): 132 SMs in all
    times = {e["func"]: {s["symbol"]: {"1": 40.0 + i, "2": 20.0 + i, "132": 10.0 + i} for i, s in enumerate(e["samples"])}
             for e in kit["funcs"]}
    results = {"kit": kit["id"], "device": "cuda", "unit_kind": "gpu_sm", "full_units": 132, "units": [1, 2, 132],
               "mechanism": "grid_limit", "times_us": times}
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert import_results(tmp_path / "kit", results, db) == 3 * sum(len(e["samples"]) for e in kit["funcs"])
    artifact = compile_model(model, target="cuda", qos_ms=10.0, database=db)
    for layer in artifact.manifest.layers:
        assert [(c.units, c.mechanism) for c in layer.candidates] == [(0, "green_context"), (2, "grid_limit"), (1, "grid_limit")]
        assert [c.latency_us for c in layer.candidates] == [10.0, 20.0, 40.0]
