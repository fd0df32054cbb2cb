"""A three-layer perceptron for flattened 28x28 images."""

from __future__ import annotations

import onnx

from .common import GraphBuilder, dense, make_model

LAYERS = (784, 256, 128, 10)


def build_mlp(seed: int = 0) -> onnx.ModelProto:
    """Builds Gemm+Relu (784->256->128) then Gemm (128->10) and Softmax.

    Input ``input`` is (1, 784); output ``output`` is (1, 10) probabilities.

    Args:
        seed: Weight seed.

    Returns:
        The ONNX model.
    """
    g = GraphBuilder(seed)
    x = "input"
    for i, (fin, fout) in enumerate(zip(LAYERS, LAYERS[1:])):
        x = dense(g, x, f"fc{i}", fin, fout)
        if i < len(LAYERS) - 2:
            x = g.op("Relu", [x], f"fc{i}.relu")
    g.op("Softmax", [x], "output", axis=-1)
    return make_model(g, "mlp", {"input": [1, LAYERS[0]]}, {"output": [1, LAYERS[-1]]})
