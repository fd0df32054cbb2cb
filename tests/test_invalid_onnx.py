"""Invalid ONNX models that onnxruntime rejects: `tvmsched compile` refuses each with one `error:` line, exit 2.

TVM's Relax importer converts such models regardless (tvmsched.frontend.validate). Every case is checked
against onnxruntime too, to prove the model really is invalid.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_user_error, make_model, run_cli
from tvmsched import models
from tvmsched.frontend import validate
from tvmsched.errors import TvmschedError

ort = pytest.importorskip("onnxruntime")

FLOAT = TensorProto.FLOAT


def value(name: str, shape, elem=FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def const(name: str, array) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array), name)


def relu(opset: int) -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 4])], [value("y", [1, 4])], opset=opset)


def no_outputs() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 4])], [])


def conv(output_shape, weight_shape=(2, 1, 3, 3), **attrs) -> onnx.ModelProto:
    """y = Conv(x[1, 1, 5, 5], w) with the given attributes."""
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)],
        [value("x", [1, 1, 5, 5])],
        [value("y", output_shape)],
        [const("w", np.ones(weight_shape, np.float32))],
    )


def reshape_int32_shape() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")],
        [value("x", [2, 3])],
        [value("y", [3, 2])],
        [const("shape", np.array([3, 2], np.int32))],  # Reshape takes int64 only
    )


def output_dtype_mismatch() -> onnx.ModelProto:
    return make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1, 4])], [value("y", [1, 4], TensorProto.INT64)])


def split(sizes, opset: int = 17) -> onnx.ModelProto:
    """Split x[1, 6] on axis 1 into two parts of the given sizes (an input from opset 13, an attribute before)."""
    if opset >= 13:
        node, inits = helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1, name="split"), [const("sizes", np.array(sizes, np.int64))]
    else:
        node, inits = helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=sizes, name="split"), []
    return make_model([node], [value("x", [1, 6])], [value("a", [1, "A"]), value("b", [1, "B"])], inits, opset=opset)


def tile_negative_repeats() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("Tile", ["x", "repeats"], ["y"], name="tile")],
        [value("x", [2, 3])],
        [value("y", [2, 3])],
        [const("repeats", np.array([1, -1], np.int64))],
    )


def pad_crop_past(declared_output) -> onnx.ModelProto:
    """Pad x[2, 3] by -2 on both sides of axis 1: the result would have -1 columns."""
    return make_model(
        [helper.make_node("Pad", ["x", "pads"], ["y"], name="pad")],
        [value("x", [2, 3])],
        [value("y", declared_output)],
        [const("pads", np.array([0, -2, 0, -2], np.int64))],
    )


def pad_crop_past_constant_node() -> onnx.ModelProto:
    """The same with the pads from a Constant node and a dynamic declared output (no declared shape to contradict)."""
    return make_model(
        [
            helper.make_node("Constant", [], ["pads"], value=const("pads_value", np.array([0, -2, 0, -2], np.int64))),
            helper.make_node("Pad", ["x", "pads"], ["y"], name="pad"),
        ],
        [value("x", [2, 3])],
        [value("y", ["N", "M"])],
    )


def avgpool_kernel_larger_than_input() -> onnx.ModelProto:
    return make_model(
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[7, 7], name="pool")],
        [value("x", [1, 1, 5, 5])],
        [value("y", [1, 1, "H", "W"])],
    )


LOW, HIGH = validate.supported_opsets()
RANGE = f"supported opsets are {LOW} to {HIGH}"

CASES = {  # name: (model factory, fragments the error line must hold)
    "no_outputs": (no_outputs, ["no graph outputs"]),
    "opset_1": (lambda: relu(1), ["opset 1", RANGE]),
    "opset_99": (lambda: relu(99), ["opset 99", RANGE]),
    "conv_negative_pads": (lambda: conv([1, 2, 1, 1], pads=[-1, -1, -1, -1]), ["Conv node 'conv'", "pads must not contain negative values"]),
    "conv_kernel_shape_not_the_weight": (lambda: conv([1, 2, 4, 4], kernel_shape=[2, 2]), ["Conv node 'conv'", "kernel_shape [2, 2]", "[2, 1, 3, 3]"]),
    "reshape_int32_shape": (reshape_int32_shape, ["Reshape node 'reshape'", "tensor(int32)", "tensor(int64)"]),
    "output_dtype_not_computed": (output_dtype_mismatch, ["graph output 'y'", "declared int64", "computes float32"]),
    "split_sizes_not_the_axis": (lambda: split([2, 2]), ["Split node 'split'", "sum of 'split' (4)", "(6)"]),
    "split_attribute_sizes_not_the_axis": (lambda: split([2, 2], opset=11), ["Split node 'split'", "sum of 'split' (4)", "(6)"]),
    "split_negative_size": (lambda: split([8, -2]), ["Split node 'split'", "'b'", "negative shape [1, -2]"]),
    "tile_negative_repeats": (tile_negative_repeats, ["Tile node 'tile'", "must not contain negative values"]),
    "pad_crops_past_the_tensor": (lambda: pad_crop_past([2, 1]), ["Pad node 'pad'", "crop more than the 3 elements of 'x'"]),
    "pad_crops_past_the_tensor_dynamic": (pad_crop_past_constant_node, ["Pad node 'pad'", "crop more than the 3 elements of 'x'"]),
    "avgpool_kernel_larger_than_input": (avgpool_kernel_larger_than_input, ["AveragePool node 'pool'", "negative shape [1, 1, -1, -1]"]),
}


def onnxruntime_rejects(model: onnx.ModelProto) -> str | None:
    """onnxruntime's error for the model (creating a session, or running it on ones), or None."""
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4  # the error is what we want, not its log lines
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = {
            v.name: np.ones([d.dim_value for d in v.type.tensor_type.shape.dim], helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))
            for v in model.graph.input
        }
        session.run(None, feeds)
    except Exception as err:  # noqa: BLE001  (whatever onnxruntime raises)
        return str(err)
    return None


@pytest.mark.parametrize("name", list(CASES))
def test_invalid_model_is_refused_in_one_line(name, tmp_path):
    factory, fragments = CASES[name]
    model = factory()
    assert onnxruntime_rejects(model), f"onnxruntime accepts {name}: not an invalid model"
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    result = run_cli("compile", path, "-o", tmp_path / f"{name}.tvms")
    assert_user_error(result, *fragments)
    assert not (tmp_path / f"{name}.tvms").exists()


def test_supported_opsets_cover_tvm_converters_and_stop_at_onnx():
    from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

    newest_converter = max(
        int(attr.removeprefix("_impl_v")) for cls in _get_convert_map().values() for attr in dir(cls) if attr.startswith("_impl_v")
    )
    assert (LOW, HIGH) == (7, onnx.defs.onnx_opset_version())
    assert newest_converter <= HIGH
    validate.check_model(relu(LOW))
    validate.check_model(relu(HIGH))
    for opset in (LOW - 1, HIGH + 1):
        with pytest.raises(TvmschedError, match=f"opset {opset}"):
            validate.check_model(relu(opset))


@pytest.mark.parametrize("name", list(models.MODELS))
def test_zoo_models_pass_the_strict_validation(name):
    model = models.build(name)
    validate.check_model(model)
    from tvmsched.frontend.loader import input_signature

    validate.check_tensor_sizes(model, input_signature(model))


def test_valid_edge_cases_pass():
    """What is close to invalid but valid (onnxruntime runs it) still passes."""
    exact_crop = pad_crop_past([2, 0])  # 3 - 2 - 1 = 0 columns: empty, but valid
    exact_crop.graph.initializer[0].CopyFrom(const("pads", np.array([0, -2, 0, -1], np.int64)))
    crop_then_pad = pad_crop_past([2, 4])
    crop_then_pad.graph.initializer[0].CopyFrom(const("pads", np.array([0, -4, 0, 5], np.int64)))
    for model in (exact_crop, crop_then_pad, conv([1, 2, 3, 3], kernel_shape=[3, 3]), split([2, 4])):
        assert onnxruntime_rejects(model) is None
        validate.check_model(model)


def conv_batchnorm(params: int) -> onnx.ModelProto:
    """Conv (2 output channels) -> BatchNormalization whose scale, B, mean and var hold `params` values."""
    return make_model(
        [
            helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
            helper.make_node("BatchNormalization", ["c", "scale", "B", "mean", "var"], ["y"], name="bn"),
        ],
        [value("x", [1, 1, 5, 5])],
        [value("y", [1, 2, 3, 3])],
        [
            const("w", np.ones((2, 1, 3, 3), np.float32)),
            *(const(name, np.full(params, fill, np.float32)) for name, fill in (("scale", 1), ("B", 0), ("mean", 0), ("var", 1))),
        ],
    )


def test_batchnorm_parameters_not_the_channel_count(tmp_path):
    model = conv_batchnorm(3)
    assert onnxruntime_rejects(model)
    path = tmp_path / "bn.onnx"
    onnx.save(model, path)
    assert_user_error(run_cli("compile", path), "BatchNormalization node 'bn'", "scale 'scale' has shape [3]", "2 channels")


def test_batchnorm_folding_refuses_mismatched_parameters():
    """The folding itself (reached without the validation through frontend.to_relax) never broadcasts."""
    from tvmsched.frontend.rewrites import fold_batchnorm_into_conv

    assert len(fold_batchnorm_into_conv(conv_batchnorm(2)).graph.node) == 1
    with pytest.raises(TvmschedError, match=r"BatchNormalization node 'bn' cannot fold into Conv 'conv': scale has shape \[3\]"):
        fold_batchnorm_into_conv(conv_batchnorm(3))


def test_compile_model_validates_too():
    from tvmsched.pipeline import compile_model

    with pytest.raises(TvmschedError, match="no graph outputs"):
        compile_model(no_outputs())


HUGE = [100000, 100000, 100]  # 10^12 float32 values: 4 TB
HUGE_BYTES = "4000000000000 bytes"


def test_huge_input_names_the_tensor_and_its_bytes(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", HUGE)], [value("y", HUGE)])
    path = tmp_path / "huge.onnx"
    onnx.save(model, path)
    assert_user_error(run_cli("compile", path), "tensor 'x'", "graph input", HUGE_BYTES, "more than")


def test_huge_input_shape_override_names_the_tensor_and_its_bytes(tmp_path):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", ["N", 100000, 100])], [value("y", ["N", 100000, 100])])
    path = tmp_path / "dynamic.onnx"
    onnx.save(model, path)
    assert_user_error(run_cli("compile", path, "--input-shape", "x=100000,100000,100"), "tensor 'x'", HUGE_BYTES)


def test_huge_constant_folded_at_compile_time_names_the_tensor_and_its_bytes(tmp_path):
    """ConstantOfShape of a constant shape: TVM would fill it on this machine while compiling."""
    model = make_model(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["c"], name="fill", value=const("one", np.ones(1, np.float32))),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        [value("x", [1])],
        [value("y", HUGE)],
        [const("shape", np.array(HUGE, np.int64))],
    )
    path = tmp_path / "huge_constant.onnx"
    onnx.save(model, path)
    assert_user_error(
        run_cli("compile", path), "tensor 'c'", "computed at compile time by ConstantOfShape node 'fill'", HUGE_BYTES,
        "this machine's memory",
    )


def test_tensor_limits(monkeypatch):
    """Under the limit passes; over this machine's memory, or over the engine's 1 TiB per tensor, does not."""
    from tvmsched.lower.targets import make_target

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [value("x", [1000, 1000])], [value("y", [1000, 1000])])
    signature = {"x": ((1000, 1000), "float32")}
    validate.check_tensor_sizes(model, signature, make_target("llvm"))
    monkeypatch.setattr(validate, "host_memory_bytes", lambda: 3_999_999)
    expected = r"tensor 'x' \(a graph input, float32\[1000, 1000\]\) needs 4000000 bytes .* this machine's memory \(3999999 bytes\)"
    with pytest.raises(TvmschedError, match=expected):
        validate.check_tensor_sizes(model, signature, make_target("llvm"))
    monkeypatch.setattr(validate, "host_memory_bytes", lambda: 1 << 60)
    big = {"x": ((1 << 19, (1 << 19) + 1), "float32")}  # just over 1 TiB of float32: the engine refuses it
    with pytest.raises(TvmschedError, match="the 1 TiB per tensor the tvmsched engine allocates"):
        validate.check_tensor_sizes(model, big, make_target("llvm"))
