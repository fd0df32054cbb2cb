"""Idempotence analysis: one hand-written kernel per rule, then the verdicts on the zoo."""

import pytest
import tvm
from tvm.script import tirx as T

from tvmsched import models
from tvmsched.passes.idempotence import analyze
from tvmsched.pipeline import lower_model


@T.prim_func(s_tir=True)
def elementwise(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            B[vi] = A[vi] * T.float32(2)


@T.prim_func(s_tir=True)
def in_place(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            B[vi] = B[vi] + A[vi]


@T.prim_func(s_tir=True)
def reduction_with_init(A: T.Buffer((4, 8), "float32"), C: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("sum"):
            vi, vk = T.axis.remap("SR", [i, k])
            with T.init():
                C[vi] = T.float32(0)
            C[vi] = C[vi] + A[vi, vk]


@T.prim_func(s_tir=True)
def accumulate_without_init(A: T.Buffer((4, 8), "float32"), C: T.Buffer((4,), "float32")):
    for i, k in T.grid(4, 8):
        with T.sblock("acc"):
            vi, vk = T.axis.remap("SR", [i, k])
            C[vi] = C[vi] + A[vi, vk]


@T.prim_func(s_tir=True)
def reads_input_writes_other(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32"), C: T.Buffer((8,), "float32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            B[vi] = A[vi]
    for i in range(8):
        with T.sblock("c"):
            vi = T.axis.remap("S", [i])
            C[vi] = B[vi] + A[vi]


@T.prim_func(s_tir=True)
def atomic(A: T.Buffer((8,), "float32"), B: T.Buffer((1,), "float32")):
    for i in range(8):
        with T.sblock("b"):
            vi = T.axis.remap("S", [i])
            T.reads(A[vi])
            T.writes(B[0])
            T.evaluate(T.call_extern("float32", "atomicAdd", B.data, A[vi]))


@T.prim_func(s_tir=True)
def opaque_call(A: T.Buffer((8,), "float32")):
    with T.sblock("call"):
        T.reads(A[0:8])
        T.writes(A[0:8])
        T.evaluate(T.call_packed("user.side_effect", A.data))


@T.prim_func
def no_blocks(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
    for i in range(8):
        B[i] = A[i]


def test_pure_elementwise_kernel_is_idempotent():
    assert analyze(elementwise).idempotent


def test_reading_and_writing_a_parameter_is_not():
    verdict = analyze(in_place)
    assert not verdict.idempotent and "'B'" in verdict.reason


def test_reduction_initialised_inside_the_kernel_is_idempotent():
    assert analyze(reduction_with_init).idempotent


def test_decomposed_reduction_is_idempotent():
    sch = tvm.s_tir.Schedule(reduction_with_init)
    block = sch.get_sblock("sum")
    sch.decompose_reduction(block, sch.get_loops(block)[1])
    assert "sum_init" in sch.mod["main"].script()
    assert analyze(sch.mod["main"]).idempotent


def test_accumulating_into_memory_from_before_the_launch_is_not():
    verdict = analyze(accumulate_without_init)
    assert not verdict.idempotent and "'C'" in verdict.reason and "initialising" in verdict.reason


def test_reading_back_an_output_is_not_proven():
    verdict = analyze(reads_input_writes_other)
    assert not verdict.idempotent and "'B'" in verdict.reason


def test_atomics_and_opaque_calls_are_not():
    assert "atomic" in analyze(atomic).reason and not analyze(atomic).idempotent
    assert "opaque call (T.call_packed)" in analyze(opaque_call).reason and not analyze(opaque_call).idempotent


def test_kernels_without_blocks_cannot_be_proven():
    verdict = analyze(no_blocks)
    assert not verdict.idempotent and "nothing can be proven" in verdict.reason


@pytest.mark.parametrize("name", ["mlp", "resnet18-small", "mobilenetv2", "bert-tiny"])
def test_zoo_layers_are_all_idempotent(name):
    _, funcs, _ = lower_model(models.build(name), "llvm")
    verdicts = {f: analyze(func) for f, func in funcs.items()}
    assert all(v.idempotent for v in verdicts.values()), {f: v.reason for f, v in verdicts.items() if not v.idempotent}
