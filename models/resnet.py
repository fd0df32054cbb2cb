"""ResNet-18-shaped CNNs (BasicBlock, four stages of two blocks)."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from .common import GraphBuilder, classifier_head, conv_bn, make_model


def basic_block(g: GraphBuilder, x: str, name: str, cin: int, cout: int, stride: int) -> str:
    """Two 3x3 conv+BN layers with an identity or 1x1 conv+BN shortcut."""
    y = conv_bn(g, x, f"{name}.conv1", cin, cout, 3, stride)
    y = g.op("Relu", [y], f"{name}.relu1")
    y = conv_bn(g, y, f"{name}.conv2", cout, cout, 3)
    shortcut = x
    if stride != 1 or cin != cout:
        shortcut = conv_bn(g, x, f"{name}.downsample", cin, cout, 1, stride)
    y = g.op("Add", [y, shortcut], f"{name}.add")
    return g.op("Relu", [y], f"{name}.relu2")


def build_resnet18(
    seed: int = 0,
    image_size: int = 224,
    widths: Sequence[int] = (64, 128, 256, 512),
    num_classes: int = 1000,
    name: str = "resnet18",
) -> onnx.ModelProto:
    """Builds a ResNet-18 with input ``input`` (1, 3, S, S) and output ``output``.

    Stem: conv7x7/2 + BN + Relu and MaxPool 3x3/2; then four stages of two
    BasicBlocks (the first block of stages 2-4 has stride 2 and a 1x1
    downsample); then GlobalAveragePool, Flatten and Gemm to ``num_classes``.

    Args:
        seed: Weight seed.
        image_size: Input height and width S.
        widths: Channel count of each of the four stages.
        num_classes: Length of the (1, num_classes) output.
        name: Graph name.

    Returns:
        The ONNX model.
    """
    g = GraphBuilder(seed)
    x = conv_bn(g, "input", "stem", 3, widths[0], 7, 2)
    x = g.op("Relu", [x], "stem.relu")
    x = g.op(
        "MaxPool", [x], "stem.pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
    )
    cin = widths[0]
    for stage, cout in enumerate(widths, start=1):
        for block in range(2):
            stride = 2 if stage > 1 and block == 0 else 1
            x = basic_block(g, x, f"layer{stage}.{block}", cin, cout, stride)
            cin = cout
    classifier_head(g, x, cin, num_classes)
    return make_model(
        g, name, {"input": [1, 3, image_size, image_size]}, {"output": [1, num_classes]}
    )


def build_resnet18_small(seed: int = 0) -> onnx.ModelProto:
    """ResNet-18 topology on (1, 3, 64, 64) with widths 16-128 and 10 classes."""
    return build_resnet18(seed, 64, (16, 32, 64, 128), 10, "resnet18-small")
