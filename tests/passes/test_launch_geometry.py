"""Thread-block counts of hand-written scheduled PrimFuncs."""

import tvm
from tvm.script import tirx as T

from tvmsched.passes.launch_geometry import thread_blocks


def count(func) -> int | None:
    return thread_blocks(tvm.IRModule({"main": func}))


def test_gpu_grid_is_the_product_of_block_indices():
    @T.prim_func
    def grid(A: T.Buffer((4, 8, 64), "float32"), B: T.Buffer((4, 8, 64), "float32")):
        for by in T.thread_binding(4, thread="blockIdx.y"):
            for bx in T.thread_binding(8, thread="blockIdx.x"):
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    B[by, bx, tx] = A[by, bx, tx] * T.float32(2)

    assert count(grid) == 32


def test_largest_of_two_kernels():
    @T.prim_func
    def two(A: T.Buffer((256,), "float32"), B: T.Buffer((256,), "float32")):
        for bx in T.thread_binding(2, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                B[bx * 128 + tx] = A[bx * 128 + tx]
        for bx in T.thread_binding(16, thread="blockIdx.x"):
            for tx in T.thread_binding(16, thread="threadIdx.x"):
                A[bx * 16 + tx] = B[bx * 16 + tx]

    assert count(two) == 16


def test_cpu_parallel_nest_and_serial():
    @T.prim_func
    def par(A: T.Buffer((6, 10, 4), "float32"), B: T.Buffer((6, 10, 4), "float32")):
        for i in T.parallel(6):
            for j in T.parallel(10):
                for k in range(4):
                    B[i, j, k] = A[i, j, k]

    @T.prim_func
    def serial(A: T.Buffer((6,), "float32"), B: T.Buffer((6,), "float32")):
        for i in range(6):
            B[i] = A[i]

    assert count(par) == 60
    assert count(serial) == 1


def test_zoo_layer_under_dlight_has_blocks():
    from tvmsched import models
    from tvmsched.frontend import loader as frontend
    from tvmsched.lower import kernels
    from tvmsched.lower import relax as lowering
    from tvmsched.lower.targets import make_target

    model, target = models.build("mlp"), make_target("cuda")
    mod = lowering.legalize_and_fuse(frontend.to_relax(model, frontend.input_signature(model)), target)
    scheduled = kernels.default_schedule(kernels.layer_funcs(mod), target)
    counts = {name: count(f) for name, f in scheduled.items()}
    assert all(c is not None and c >= 1 for c in counts.values()), counts
    assert max(counts.values()) > 1, counts
