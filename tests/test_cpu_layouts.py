"""Convolutions run NHWC on CPUs (lowering.to_cpu_layouts). What TVM's ConvertLayout leaves in the model's NCHW layout
between them — a ReLU6 (ONNX Clip), an explicit Pad — is moved into NHWC so that it fuses with the convolutions
(lowering._sink_transposes); a Sum is Adds (rewrites.sum_as_add); and a padding never becomes a convolution's
epilogue (lowering._reshaping_as_injective). Each checked against onnxruntime, NaN included."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import make_model
from tvmsched import pipeline
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor

pytest.importorskip("onnxruntime")

C, SIZE = 16, 12


def network(middle, seed: int = 0):
    """x [1, 3, SIZE, SIZE] -> 1x1 Conv to C channels -> `middle` nodes (reading "a", writing "y"), with their
    initializers; weights w1 and the depthwise 3x3 wd are given. (model, feeds)."""
    rng = np.random.default_rng(seed)
    nodes, inits = middle
    inits = [numpy_helper.from_array(rng.standard_normal((C, 3, 1, 1)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(C).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((C, 1, 3, 3)).astype(np.float32), "wd"), *inits]
    model = make_model([helper.make_node("Conv", ["x", "w1", "b1"], ["a"]), *nodes],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], inits)
    return model, {"x": rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)}


def layers(model, target: str = "llvm") -> list[str]:
    graph, _, _ = pipeline.lower_model(model, target)
    return [layer.func for layer in graph.layers]


def check(model, feeds, reference) -> None:
    got, want = Executor(compile_model(model)).run(feeds)["y"], reference(model, feeds)["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


BOUNDS = [numpy_helper.from_array(np.array(0.0, np.float32), "lo"), numpy_helper.from_array(np.array(6.0, np.float32), "hi")]


def test_relu6_between_convolutions_fuses_into_them_in_nhwc(reference):
    """MobileNet-v2's block: Conv, Clip(0, 6), depthwise Conv, Clip(0, 6). TVM's Clip kernels stayed NCHW between two
    transposes, a layer of their own (29% of MobileNet-v2's time on a CPU); now each Clip is its convolution's
    epilogue, and a NaN still gives NaN."""
    model, feeds = network(([helper.make_node("Clip", ["a", "lo", "hi"], ["r"]),
                             helper.make_node("Conv", ["r", "wd"], ["d"], group=C, pads=[1] * 4),
                             helper.make_node("Clip", ["d", "lo", "hi"], ["y"])], BOUNDS))
    funcs = layers(model)
    assert len(funcs) == 4 and all("transpose" not in f for f in funcs[1:-1]), funcs  # x in, conv, conv, y out
    assert all("conv2d" in f and "where" in f for f in funcs[1:-1]), funcs
    feeds["x"][0, 0, 3, 4] = np.nan
    check(model, feeds, reference)


@pytest.mark.parametrize("operands", [2, 3])
def test_a_sum_is_adds_that_join_the_convolution(reference, operands):
    """A residual Sum and its Relu (ResNet-50 as the ONNX model zoo has it): TVM made a Sum a concatenation of
    broadcast copies and a reduction, apart from the convolution (28% of that ResNet-50's CPU time)."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((1, C, 1, 1)).astype(np.float32), "shift")]
    model, feeds = network(([helper.make_node("Conv", ["a", "wd"], ["d"], group=C, pads=[1] * 4),
                             helper.make_node("Sum", ["d", "a", "shift"][:operands], ["s"]),
                             helper.make_node("Relu", ["s"], ["y"])], inits))
    funcs = layers(model)
    assert not any("concatenate" in f or "sum" in f for f in funcs), funcs
    assert any("conv2d1" in f and f.count("add") == operands - 1 and "relu" in f for f in funcs), funcs
    check(model, feeds, reference)


@pytest.mark.parametrize("stride", [1, 2])
def test_an_explicit_padding_becomes_the_convolutions_own(reference, stride):
    """EfficientNet's TF 'same' padding: a Pad of one row and column after (before a stride-2 depthwise Conv).
    It was a layer of its own, NCHW between two transposes; now the convolution pads."""
    pads = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
    model, feeds = network(([helper.make_node("Pad", ["a", "pads"], ["p"], mode="constant"),
                             helper.make_node("Conv", ["p", "wd"], ["y"], group=C, strides=[stride] * 2)], [pads]))
    funcs = layers(model)
    assert not any("pad" in f for f in funcs) and len(funcs) == 4, funcs
    check(model, feeds, reference)


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_a_padding_is_never_a_convolutions_epilogue(reference, target):
    """A Pad after a convolution, before a MaxPool (so not the next convolution's own). TVM calls a padding
    element-wise, so FuseOps made it the convolution's epilogue; the CPU schedule, per output tile of the convolution,
    never wrote the padded border (NaN and wrong values). On CUDA (EfficientNet in fp16) the same layers formed."""
    pads = numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "pads")
    model, feeds = network(([helper.make_node("Pad", ["a", "pads"], ["p"], mode="constant"),
                             helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2])], [pads]))
    assert not any("pad" in f.split("conv2d", 1)[-1] for f in layers(model, target) if "conv2d" in f)
    if target == "llvm":
        check(model, feeds, reference)
