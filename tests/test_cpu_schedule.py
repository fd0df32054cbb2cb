"""issue 16: the default CPU schedules on grouped convolutions (AlexNet's two groups, ShuffleNet's 34- and
68-channel groups, depthwise with a channel multiplier): the tiled rule takes them, groups of a width no wide
vector tile divides are computed padded (lowering._pad_groups), and the outputs match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import tirx

from tests.helpers import make_model, onnxruntime_outputs
from tvmsched import cpu_schedule, frontend, lowering
from tvmsched.kernels import layer_funcs
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor
from tvmsched.targets import make_target

pytest.importorskip("onnxruntime")


def grouped_conv(cin: int, cout: int, groups: int, k: int, size: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array(rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=groups, pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, size, size])], [weight, bias])
    return model, {"x": rng.standard_normal((1, cin, size, size)).astype(np.float32)}


# (in channels, out channels, groups, kernel): output channels per group 64, 34, 68, 2, 10 and depthwise
CASES = [(32, 128, 2, 5), (136, 136, 4, 1), (68, 136, 2, 1), (12, 24, 12, 3), (30, 30, 3, 3), (16, 16, 16, 3)]


@pytest.mark.parametrize("cin,cout,groups,k", CASES)
def test_grouped_convolutions_match_onnxruntime(cin, cout, groups, k):
    model, feeds = grouped_conv(cin, cout, groups, k)
    artifact = compile_model(model)
    got = Executor(artifact).run(feeds)["y"]
    want = onnxruntime_outputs(model, feeds)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    width = cout // groups
    padded = lowering.padded_group_width(width) is not None
    sliced = any("strided_slice" in layer.func for layer in artifact.manifest.layers)
    assert sliced == padded, [layer.func for layer in artifact.manifest.layers]


@pytest.mark.parametrize("cin,cout,groups,k", CASES)
def test_grouped_convolutions_take_the_tiled_rule(cin, cout, groups, k):
    """Before, a group's input channel ff // width * cin + rc failed the contiguity test: the layer fell to
    dlight's row reduction, unvectorized (AlexNet's 5x5 group-2 conv: 207 ms, tiled: 1.7 ms)."""
    model, _ = grouped_conv(cin, cout, groups, k)
    target = make_target("llvm")
    mod, _ = frontend.import_model(model, frontend.input_signature(model, {}))
    funcs = layer_funcs(lowering.legalize_and_fuse(mod, target))
    convs = {name: f for name, f in funcs.items() if "conv2d" in name}
    assert convs, list(funcs)
    for name, func in convs.items():
        rule, sch = cpu_schedule.schedule_with_rule(func, target)
        assert rule == "TiledReduction", (name, rule)
        assert "vectorize" in str(sch.trace) and "parallel" in str(sch.trace)


def test_padding_is_a_parallel_vectorized_copy_not_a_test_per_multiply_add():
    """Inlined into the reduction, the padding's bounds test ran per multiply-add (ResNet-18's 3x3 convs 2.2x
    slower): the padded copy is made first, parallel and vectorized; unpadded producers and the padding of
    a depthwise conv are still inlined."""
    target = make_target("llvm")
    # a 26x26x64 padded input (above PAD_COPY_MIN_ELEMENTS); depthwise sums only 9 products per output
    for groups, k, padded in ((1, 3, True), (1, 1, False), (64, 3, False)):
        model, feeds = grouped_conv(64, 64, groups, k, size=24)
        mod, _ = frontend.import_model(model, frontend.input_signature(model, {}))
        (func,) = [f for name, f in layer_funcs(lowering.legalize_and_fuse(mod, target)).items() if "conv2d" in name]
        rule, sch = cpu_schedule.schedule_with_rule(func, target)
        assert rule == "TiledReduction"
        blocks = [sch.get(b).name_hint for b in cpu_schedule._blocks(sch)]
        assert ("pad_temp" in blocks) == padded, blocks
        if padded:
            kinds = {int(sch.get(loop).kind) for loop in sch.get_loops(sch.get_sblock("pad_temp"))}
            assert {int(tirx.ForKind.PARALLEL), int(tirx.ForKind.VECTORIZED)} <= kinds, kinds
        got = Executor(compile_model(model)).run(feeds)["y"]
        np.testing.assert_allclose(got, onnxruntime_outputs(model, feeds)["y"], rtol=1e-4, atol=1e-3)
