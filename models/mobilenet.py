"""A small MobileNetV2-style network of inverted-residual blocks."""

from __future__ import annotations

import onnx

from .common import GraphBuilder, classifier_head, conv_bn, make_model

IMAGE_SIZE = 96
STEM_CHANNELS = 32
LAST_CHANNELS = 256
NUM_CLASSES = 10
# (expansion t, output channels c, repeats n, first stride s), as in the paper.
BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 2, 2), (6, 96, 1, 1))


def relu6(g: GraphBuilder, x: str, name: str) -> str:
    """Clip(x, 0, 6) with opset-17 min/max constant inputs."""
    return g.op("Clip", [x, g.shared("relu6.min", 0.0), g.shared("relu6.max", 6.0)], name)


def inverted_residual(
    g: GraphBuilder, x: str, name: str, cin: int, cout: int, expand: int, stride: int
) -> str:
    """1x1 expand, 3x3 depthwise, linear 1x1 project; Add when shapes match."""
    hidden = cin * expand
    y = x
    if expand != 1:
        y = relu6(g, conv_bn(g, y, f"{name}.expand", cin, hidden, 1), f"{name}.expand.relu6")
    y = conv_bn(g, y, f"{name}.dw", hidden, hidden, 3, stride, group=hidden)
    y = relu6(g, y, f"{name}.dw.relu6")
    y = conv_bn(g, y, f"{name}.project", hidden, cout, 1)
    if stride == 1 and cin == cout:
        y = g.op("Add", [y, x], f"{name}.add")
    return y


def build_mobilenetv2(seed: int = 0) -> onnx.ModelProto:
    """Builds the net: input ``input`` (1, 3, 96, 96), output ``output`` (1, 10).

    Stem conv3x3/2 + BN + Relu6, the inverted-residual stages in ``BLOCKS``,
    a 1x1 conv + BN + Relu6 to 256 channels, GlobalAveragePool, Flatten and
    Gemm to 10 logits.

    Args:
        seed: Weight seed.

    Returns:
        The ONNX model.
    """
    g = GraphBuilder(seed)
    x = relu6(g, conv_bn(g, "input", "stem", 3, STEM_CHANNELS, 3, 2), "stem.relu6")
    cin = STEM_CHANNELS
    for stage, (expand, cout, repeats, first_stride) in enumerate(BLOCKS):
        for i in range(repeats):
            stride = first_stride if i == 0 else 1
            x = inverted_residual(g, x, f"block{stage}.{i}", cin, cout, expand, stride)
            cin = cout
    x = relu6(g, conv_bn(g, x, "last", cin, LAST_CHANNELS, 1), "last.relu6")
    classifier_head(g, x, LAST_CHANNELS, NUM_CLASSES)
    return make_model(
        g,
        "mobilenetv2",
        {"input": [1, 3, IMAGE_SIZE, IMAGE_SIZE]},
        {"output": [1, NUM_CLASSES]},
    )
