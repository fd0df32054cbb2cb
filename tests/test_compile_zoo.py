"""Every zoo model compiles, runs in our executor and matches onnxruntime."""

import numpy as np
import pytest

from tvmsched import models
from tvmsched.runtime import Executor

RTOL = ATOL = 1e-4  # fp32


@pytest.mark.parametrize("name", [spec.name for spec in models.list_models()])
def test_zoo_model_matches_onnxruntime(compiled, reference, name):
    """The compile is the shared cache's (`compile_model(model, name=name)`, saved): made here or by another
    test of the run that compiled the same model with the same options."""
    model = models.build(name)
    executor = Executor(compiled(name))
    inputs = models.random_inputs(model, seed=1)
    outputs = executor.run(inputs)
    want = reference(model, inputs)
    assert list(outputs) == list(want)
    for key, expected in want.items():
        np.testing.assert_allclose(outputs[key], expected, rtol=RTOL, atol=ATOL)
    # a second run reuses the buffers and must give the same result
    again = executor.run(inputs)
    for key in outputs:
        np.testing.assert_array_equal(again[key], outputs[key])


def test_tiny_model_output_is_known_by_arithmetic(compiled):
    executor = Executor(compiled.artifact("tiny"))
    x = np.array([[-1.0, 0.25, 0.5, 3.0]], dtype=np.float32)
    np.testing.assert_array_equal(executor.run({"x": x})["y"], np.maximum(2 * x - 1, 0))


def test_layers_are_in_topological_order_with_estimates(compiled):
    artifact = compiled.artifact("resnet18-small")
    produced = {b.tensor for b in artifact.manifest.inputs} | set(artifact.weights)
    for layer in artifact.manifest.layers:
        assert set(layer.inputs) <= produced, layer.func
        produced |= set(layer.outputs)
        assert layer.bytes > 0
        assert [c.id for c in layer.candidates] == [0]
    convs = [layer for layer in artifact.manifest.layers if "conv2d" in layer.func]
    assert convs and all(layer.flops > 0 for layer in convs)
    # the first conv: 1x3x64x64 -> 16x32x32 with 7x7 kernels = 2*16*32*32*3*49 multiply-adds
    assert convs[0].flops >= 2 * 16 * 32 * 32 * 3 * 49
