"""NaN and infinities propagate as ONNX / IEEE define them (checked against onnxruntime): Relu, Clip,
Max, Min and HardSigmoid lowered to max/min kernels once dropped a NaN operand (Relu(NaN) = 0)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

from tests.helpers import make_model
from tvmsched import models
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor

X = np.array([np.nan, -np.inf, np.inf, -2.0, 0.5, 3.0, -0.0, np.nan], "float32")
Z = np.array([1.0, np.nan, 0.0, np.nan, -1.0, 5.0, 0.0, np.nan], "float32")


def one_op(op: str, inputs: list[str], initializers=(), **attrs):
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [8]) for name in inputs if name in ("x", "z")]
    return make_model([helper.make_node(op, inputs, ["y"], **attrs)], values,
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])], list(initializers))


BOUNDS = [helper.make_tensor("lo", TensorProto.FLOAT, [], [-1.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [1.0])]
CASES = {
    "Relu": one_op("Relu", ["x"]),
    "Clip": one_op("Clip", ["x", "lo", "hi"], BOUNDS),
    "Max": one_op("Max", ["x", "z"]),
    "Min": one_op("Min", ["x", "z"]),
    "HardSigmoid": one_op("HardSigmoid", ["x"]),
    "LeakyRelu": one_op("LeakyRelu", ["x"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_nan_and_inf_match_onnxruntime(compiled, reference, name):
    model = CASES[name]
    feeds = {"x": X, "z": Z} if name in ("Max", "Min") else {"x": X}
    expected = reference(model, feeds)["y"]
    got = Executor(compiled.artifact(model)).run(feeds)["y"]  # shared: tests/serve/test_hostile_requests.py serves LeakyRelu
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=0)


def test_a_nan_input_gives_a_nan_answer_not_a_plausible_softmax(compiled, reference):
    model = models.build("mlp")
    x = models.random_inputs(model, seed=0)
    x["input"][0, 3] = np.nan
    expected = reference(model, x)["output"]
    got = Executor(compiled.artifact("mlp")).run(x)["output"]  # the zoo's mlp, compiled as any other test does
    assert np.isnan(expected).all() and np.isnan(got).all()


def test_clip_with_attribute_bounds_keeps_them(reference):
    """Clip before opset 11 takes min/max as attributes: the NaN rewrite kept only LayerNormalization's
    attribute names, so Clip-6 lost its bounds (and clipped nothing)."""
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4])
    model = make_model([helper.make_node("Clip", ["x"], ["y"], min=0.0, max=6.0)], [value("x")], [value("y")], opset=10)
    x = np.array([[-3.0, 2.0, 9.0, np.nan]], np.float32)
    expected = reference(model, {"x": x})["y"]
    np.testing.assert_array_equal(Executor(compile_model(model)).run({"x": x})["y"], expected)  # [0, 2, 6, nan]
