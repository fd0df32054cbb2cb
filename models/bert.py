"""A BERT-tiny-style transformer encoder over pre-computed embeddings."""

from __future__ import annotations

import math

import numpy as np
import onnx

from .common import GraphBuilder, make_model

SEQ = 128
HIDDEN = 128
HEADS = 2
HEAD_DIM = HIDDEN // HEADS
FFN = 512
LAYERS = 2
EPSILON = 1e-12


def linear(g: GraphBuilder, x: str, name: str, fin: int, fout: int) -> str:
    """MatMul + Add on a (1, SEQ, fin) input, weights scaled by 1/sqrt(fin)."""
    w = g.normal(f"{name}.weight", [fin, fout], 1.0 / math.sqrt(fin))
    b = g.normal(f"{name}.bias", [fout], 0.1)
    return g.op("Add", [g.op("MatMul", [x, w], f"{name}.matmul"), b], name)


def layer_norm(g: GraphBuilder, x: str, name: str, out: str | None = None) -> str:
    """LayerNormalization over the last axis with random affine parameters.

    The output tensor is called ``out`` if given, else ``name``.
    """
    gamma = g.uniform(f"{name}.gamma", [HIDDEN], 0.8, 1.2)
    beta = g.normal(f"{name}.beta", [HIDDEN], 0.1)
    return g.op("LayerNormalization", [x, gamma, beta], out or name, axis=-1, epsilon=EPSILON)


def gelu(g: GraphBuilder, x: str, name: str) -> str:
    """Exact GELU built from Erf: ``0.5 * x * (1 + Erf(x / sqrt(2)))``."""
    y = g.op("Mul", [x, g.shared("gelu.rsqrt2", 1.0 / math.sqrt(2.0))], f"{name}.scale")
    y = g.op("Erf", [y], f"{name}.erf")
    y = g.op("Add", [y, g.shared("gelu.one", 1.0)], f"{name}.add")
    y = g.op("Mul", [x, y], f"{name}.mul")
    return g.op("Mul", [y, g.shared("gelu.half", 0.5)], name)


def split_heads(g: GraphBuilder, x: str, name: str, perm: list[int]) -> str:
    """Reshapes (1, SEQ, HIDDEN) to (1, SEQ, HEADS, HEAD_DIM) and transposes."""
    shape = g.shared("shape.heads", np.array([1, SEQ, HEADS, HEAD_DIM], dtype=np.int64))
    y = g.op("Reshape", [x, shape], f"{name}.reshape")
    return g.op("Transpose", [y], f"{name}.transpose", perm=perm)


def self_attention(g: GraphBuilder, x: str, name: str) -> str:
    """Multi-head scaled dot-product self-attention plus output projection."""
    q = split_heads(g, linear(g, x, f"{name}.q", HIDDEN, HIDDEN), f"{name}.q", [0, 2, 1, 3])
    k = split_heads(g, linear(g, x, f"{name}.k", HIDDEN, HIDDEN), f"{name}.k", [0, 2, 3, 1])
    v = split_heads(g, linear(g, x, f"{name}.v", HIDDEN, HIDDEN), f"{name}.v", [0, 2, 1, 3])
    scores = g.op("MatMul", [q, k], f"{name}.scores")
    scale = g.shared("attention.scale", 1.0 / math.sqrt(HEAD_DIM))
    scores = g.op("Mul", [scores, scale], f"{name}.scaled")
    probs = g.op("Softmax", [scores], f"{name}.probs", axis=-1)
    ctx = g.op("MatMul", [probs, v], f"{name}.context")
    ctx = g.op("Transpose", [ctx], f"{name}.merge", perm=[0, 2, 1, 3])
    shape = g.shared("shape.hidden", np.array([1, SEQ, HIDDEN], dtype=np.int64))
    ctx = g.op("Reshape", [ctx, shape], f"{name}.merged")
    return linear(g, ctx, f"{name}.out", HIDDEN, HIDDEN)


def encoder_layer(g: GraphBuilder, x: str, name: str, out: str | None = None) -> str:
    """Post-LN encoder layer: attention and GELU FFN, each with residual + LN."""
    a = self_attention(g, x, f"{name}.attn")
    x = layer_norm(g, g.op("Add", [x, a], f"{name}.attn.residual"), f"{name}.attn.ln")
    f = gelu(g, linear(g, x, f"{name}.ffn.in", HIDDEN, FFN), f"{name}.ffn.gelu")
    f = linear(g, f, f"{name}.ffn.out", FFN, HIDDEN)
    y = g.op("Add", [x, f], f"{name}.ffn.residual")
    return layer_norm(g, y, f"{name}.ffn.ln", out)


def build_bert_tiny(seed: int = 0) -> onnx.ModelProto:
    """Builds a 2-layer encoder (hidden 128, 2 heads, FFN 512, sequence 128).

    Input ``hidden_states`` and output ``output`` are float32 (1, 128, 128).

    Args:
        seed: Weight seed.

    Returns:
        The ONNX model.
    """
    g = GraphBuilder(seed)
    x = "hidden_states"
    for i in range(LAYERS):
        x = encoder_layer(g, x, f"layer{i}", "output" if i == LAYERS - 1 else None)
    shape = [1, SEQ, HIDDEN]
    return make_model(g, "bert-tiny", {"hidden_states": shape}, {"output": shape})
