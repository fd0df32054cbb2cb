"""A four-feature toy model whose output is known by arithmetic."""

from __future__ import annotations

import numpy as np
import onnx

from .common import GraphBuilder, make_model

FEATURES = 4


def build_tiny(seed: int = 0) -> onnx.ModelProto:
    """Builds ``y = Relu(x @ W + b)`` with ``W = 2 * I`` and ``b = -1``.

    Input ``x`` and output ``y`` are float32 of shape (1, 4), so elementwise
    ``y = max(2 * x - 1, 0)``. The weights are fixed constants; ``seed`` is
    accepted for interface uniformity and ignored.

    Args:
        seed: Ignored.

    Returns:
        The ONNX model.
    """
    del seed
    g = GraphBuilder()
    w = g.const("W", 2.0 * np.eye(FEATURES, dtype=np.float32))
    b = g.const("b", -np.ones(FEATURES, dtype=np.float32))
    h = g.op("MatMul", ["x", w], "matmul")
    h = g.op("Add", [h, b], "add")
    g.op("Relu", [h], "y")
    shape = [1, FEATURES]
    return make_model(g, "tiny", {"x": shape}, {"y": shape}, "y = max(2 * x - 1, 0)")
