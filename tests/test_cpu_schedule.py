"""issue 16: the default CPU schedules on grouped convolutions (AlexNet's two groups, ShuffleNet's 34- and
68-channel groups, depthwise with a channel multiplier): the tiled rule takes them, groups of a width no wide
vector tile divides are computed padded (lowering._pad_groups), and the outputs match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from tvm import tirx

from tests.helpers import make_model
from tvmsched.lower import cpu_schedule
from tvmsched.frontend import loader as frontend
from tvmsched.lower import relax as lowering
from tvmsched.lower.kernels import layer_funcs
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor
from tvmsched.lower.targets import make_target

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
def test_grouped_convolutions_match_onnxruntime(reference, cin, cout, groups, k):
    model, feeds = grouped_conv(cin, cout, groups, k)
    artifact = compile_model(model)
    got = Executor(artifact).run(feeds)["y"]
    want = reference(model, feeds)["y"]
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


def test_padding_is_a_parallel_vectorized_copy_not_a_test_per_multiply_add(reference):
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
        np.testing.assert_allclose(got, reference(model, feeds)["y"], rtol=1e-4, atol=1e-3)


def dense(n: int, gemm: bool, seed: int = 0):
    """x [rows, 24] @ w + b, then Relu: a MatMul (w [24, n]) or a Gemm (w [n, 24], transB)."""
    rng = np.random.default_rng(seed)
    rows = [5] if gemm else [2, 5]
    w = rng.standard_normal((n, 24) if gemm else (24, n)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    if gemm:
        nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["c"], transB=1)]
    else:
        nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["c"])]
    nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*rows, 24])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*rows, n])], inits)
    return model, {"x": rng.standard_normal((*rows, 24)).astype(np.float32)}


def weight_shapes(model, target) -> dict[str, list[tuple[int, ...]]]:
    """Each lowered layer's constant operands' shapes (lifted to parameters named param_*)."""
    mod, _ = frontend.import_model(model, frontend.input_signature(model, {}))
    funcs = layer_funcs(lowering.legalize_and_fuse(mod, target))
    return {name: [tuple(int(d) for d in param.shape) for param in func.params if "param" in param.name]
            for name, func in funcs.items()}


@pytest.mark.parametrize("n,gemm", [(64, False), (64, True), (48, False), (7, False), (7, True)])
def test_dense_weights_are_packed_at_compile_time(reference, n, gemm):
    """A constant weight [K, N] is read packed as [N / tv, K, tv] (tv: the vector tile on N), so one output
    tile's weights are contiguous (a 128x1408x512 matmul 1.33x faster); N with no vector tile stays [K, N]."""
    model, feeds = dense(n, gemm)
    target = make_target("llvm")
    lanes = cpu_schedule.vector_lanes(target)
    tiles = cpu_schedule.vector_factors(n, lanes)
    shapes = [s for name, shapes in weight_shapes(model, target).items() if "matmul" in name for s in shapes]
    want = (n // tiles[0], 24, tiles[0]) if tiles else (24, n)
    assert want in shapes, shapes
    got = Executor(compile_model(model)).run(feeds)["y"]
    np.testing.assert_allclose(got, reference(model, feeds)["y"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config,width,registers", [
    ({"kind": "llvm", "mcpu": "znver3"}, 256, 16),  # AVX2, no AVX-512
    ({"kind": "llvm", "mcpu": "haswell"}, 256, 16),
    ({"kind": "llvm", "mcpu": "skylake-avx512"}, 512, 32),
    ({"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["-avx512f"]}, 256, 16),  # AVX-512 hidden (a guest)
    ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1"}, 128, 32),
])
def test_the_vector_width_and_the_tile_follow_the_cpu_features(config, width, registers):
    """The vector tile comes from the CPU features the target enables (TVM's llvm_get_vector_width says 512 for every
    x86 mcpu), its accumulators from the register file: an AVX2 convolution's weights are packed by 2 ymm vectors
    (16 floats), not by 2 AVX-512 ones, and a tile's accumulators fit in 3/4 of the registers."""
    from tvm.target import Target

    target = Target(config)
    assert (cpu_schedule.vector_width(target), cpu_schedule.vector_registers(target)) == (width, registers)
    assert cpu_schedule.max_accumulators(target) == registers * 3 // 4
    model, _ = grouped_conv(16, 64, 1, 3)
    tv = 2 * width // 32  # two vectors of floats
    shapes = [s for name, shapes in weight_shapes(model, target).items() if "conv2d" in name for s in shapes]
    assert (64 // tv, 3, 3, 16, tv) in shapes, shapes


def test_convolution_weights_are_packed_at_compile_time(reference):
    """One-group NHWC convolutions read HWIO weights packed as [CO / tv, KH, KW, CI, tv]; grouped ones keep
    HWIO (their tile spans one group); strided, dilated and asymmetrically padded ones match onnxruntime."""
    target = make_target("llvm")
    tv = cpu_schedule.vector_factors(64, cpu_schedule.vector_lanes(target))[0]
    model, feeds = grouped_conv(16, 64, 1, 3)
    shapes = [s for name, shapes in weight_shapes(model, target).items() if "conv2d" in name for s in shapes]
    assert (64 // tv, 3, 3, 16, tv) in shapes, shapes
    grouped, _ = grouped_conv(32, 128, 2, 5)
    shapes = [s for name, shapes in weight_shapes(grouped, target).items() if "conv2d" in name for s in shapes]
    assert (5, 5, 16, 128) in shapes, shapes
    rng = np.random.default_rng(1)
    for strides, dilations, pads in (((2, 2), (1, 1), (1, 1, 1, 1)), ((1, 2), (2, 1), (0, 2, 1, 0))):
        weight = numpy_helper.from_array(rng.standard_normal((32, 8, 3, 3)).astype(np.float32), "w")
        node = helper.make_node("Conv", ["x", "w"], ["y"], strides=strides, dilations=dilations, pads=pads)
        out = [(size + pads[i] + pads[i + 2] - dilations[i] * 2 - 1) // strides[i] + 1 for i, size in enumerate((11, 13))]
        model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 11, 13])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, *out])], [weight])
        feeds = {"x": rng.standard_normal((1, 8, 11, 13)).astype(np.float32)}
        got = Executor(compile_model(model)).run(feeds)["y"]
        np.testing.assert_allclose(got, reference(model, feeds)["y"], rtol=1e-4, atol=1e-4)


def test_cuda_keeps_the_weight_layouts():
    """Packing is for the CPU tiles: dlight's GPU rules expect the weights as the model has them."""
    model, _ = dense(64, False)
    shapes = [s for name, shapes in weight_shapes(model, make_target("cuda")).items() for s in shapes]
    assert (24, 64) in shapes, shapes


@pytest.mark.parametrize("outputs, reduction, parallel", [
    (256, 784, True),   # mlp's first layer: 256 outputs of 784 products each (200 704 in all)
    (128, 256, False),  # its second: 32 768 products, fewer than a thread's wake-up is worth
    (4096, 8, True),    # many outputs: parallel whatever their sums (MIN_PARALLEL_WORK)
])
def test_few_outputs_with_long_sums_run_on_every_thread(outputs, reduction, parallel):
    """A layer of few outputs each summing many products (a batch-1 dense layer, a late-stage convolution on a 2x2 map)
    is parallel over its output tiles: before, only the outputs' count decided, and mlp's first layer and
    resnet18-small's last stage ran on one thread (bench/results/speed.md: mlp 11.6 -> 8.0 µs, resnet18-small
    122 -> 98 µs, the outputs bit-identical)."""
    rows = 1 if outputs <= reduction else outputs // 256
    cols = outputs // rows
    weight = numpy_helper.from_array(np.ones((reduction, cols), np.float32), "w")
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, reduction])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, cols])], [weight])
    target = make_target("llvm")
    mod, _ = frontend.import_model(model, frontend.input_signature(model, {}))
    (func,) = [f for name, f in layer_funcs(lowering.legalize_and_fuse(mod, target)).items() if "matmul" in name]
    rule, sch = cpu_schedule.schedule_with_rule(func, target)
    assert rule == "TiledReduction"
    assert ("parallel" in str(sch.trace)) is parallel, str(sch.trace)
