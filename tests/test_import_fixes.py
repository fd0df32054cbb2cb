"""issue 16: real exports that did not import — dynamic-axes TorchScript exports (shape arithmetic folded at
the ONNX level with the input shapes fixed, tvmsched.frontend.fold), PRelu with a per-channel slope, Slice in its
opset-1 attribute form — and refusals that name the op and the reason. Outputs are compared with onnxruntime."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import onnxruntime_outputs
from tvmsched.errors import TvmschedError
from tvmsched.frontend.fold import MAX_FOLDED_BYTES, fold_constants
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=17, ir_version=8) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def _assert_matches(model: onnx.ModelProto, feeds: dict, input_shapes: dict | None = None, reference_model=None,
                    rtol: float = 1e-4) -> None:
    outputs = Executor(compile_model(model, input_shapes=input_shapes)).run(feeds)
    reference = onnxruntime_outputs(reference_model or model, feeds)
    assert sorted(outputs) == sorted(reference)
    for name, want in reference.items():
        got = outputs[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        scale = max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=name)


# --------------------------------------------------------------------------------------- PRelu


@pytest.mark.parametrize("slope_shape", [(8, 1, 1), (1, 8, 1, 1), (6,), (1,), ()])
def test_prelu_slopes_onnx_broadcasts(slope_shape):
    rng = np.random.default_rng(0)
    slope = numpy_helper.from_array(np.asarray(rng.uniform(0.05, 0.5, slope_shape), np.float32), "slope")
    model = _model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [("x", F, [1, 8, 5, 6])], [("y", F, [1, 8, 5, 6])],
                   [slope])
    _assert_matches(model, {"x": rng.standard_normal((1, 8, 5, 6)).astype(np.float32)})


def test_prelu_per_channel_slope_applies_per_channel(caplog):
    """A [C] slope on NCHW (Caffe2 / MXNet exports): TVM asserted in lowering (a bare AssertionError) and
    onnxruntime refuses it; it now imports per channel, as meant, with a warning."""
    rng = np.random.default_rng(1)
    slope = np.asarray(rng.uniform(0.05, 0.5, 8), np.float32)
    node = helper.make_node("PRelu", ["x", "slope"], ["y"], name="prelu_c")
    model = _model([node], [("x", F, [2, 8, 5, 6])], [("y", F, [2, 8, 5, 6])], [numpy_helper.from_array(slope, "slope")])
    per_channel = _model([node], [("x", F, [2, 8, 5, 6])], [("y", F, [2, 8, 5, 6])],
                         [numpy_helper.from_array(slope.reshape(8, 1, 1), "slope")])
    with caplog.at_level(logging.WARNING, logger="tvmsched.frontend.rewrites"):
        _assert_matches(model, {"x": rng.standard_normal((2, 8, 5, 6)).astype(np.float32)}, reference_model=per_channel)
    assert "prelu_c" in caplog.text and "per channel" in caplog.text


def test_prelu_slope_that_cannot_broadcast_names_the_op():
    slope = numpy_helper.from_array(np.full(5, 0.1, np.float32), "slope")
    model = _model([helper.make_node("PRelu", ["x", "slope"], ["y"], name="bad_prelu")], [("x", F, [1, 8, 6, 6])],
                   [("y", F, [1, 8, 6, 6])], [slope])
    with pytest.raises(TvmschedError, match=r"PRelu node 'bad_prelu': its slope 'slope' of shape \[5\] does not "
                                            r"broadcast against its input 'x' of shape \[1, 8, 6, 6\]"):
        compile_model(model)


# --------------------------------------------------------------------------------------- Slice-1


@pytest.mark.parametrize(("attrs", "shape"), [
    ({"starts": [1, 0], "ends": [3, -1], "axes": [0, 2]}, [2, 3, 4]),
    ({"starts": [1], "ends": [1000]}, [3, 3, 5]),  # no axes: the leading ones; ends clamped
    ({"starts": [-3], "ends": [-1], "axes": [-1]}, [4, 3, 2]),
])
def test_slice_opset1_attribute_form(attrs, shape):
    model = _model([helper.make_node("Slice", ["x"], ["s"], **attrs), helper.make_node("Relu", ["s"], ["y"])],
                   [("x", F, [4, 3, 5])], [("y", F, shape)], opset=9, ir_version=4)
    _assert_matches(model, {"x": np.random.default_rng(2).standard_normal((4, 3, 5)).astype(np.float32)})


def test_slice_opset1_on_a_computed_tensor_in_a_light_model_style_graph():
    """Slice-1 of a Conv output (not foldable): the attribute form becomes Slice-10's constant inputs."""
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Slice", ["c"], ["y"], starts=[1, 2], ends=[3, 7], axes=[1, 3])]
    model = _model(nodes, [("x", F, [1, 3, 8, 8])], [("y", F, [1, 2, 8, 5])], [weight], opset=9, ir_version=4)
    _assert_matches(model, {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)})


# --------------------------------------------------------------------------------------- onnx_fold


def _shape_chain_model() -> onnx.ModelProto:
    """x -> Reshape(x, Concat(Gather(Shape(x), 0), [-1])): a dynamic-axes export's flatten."""
    const = lambda name, value: numpy_helper.from_array(np.array(value, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]), helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["flat"]), helper.make_node("Relu", ["flat"], ["y"])]
    return _model(nodes, [("x", F, ["batch", 3, 4])], [("y", F, ["batch", "rest"])],
                  [const("zero", 0), const("axes", [0]), const("minus1", [-1])])


def test_fold_replaces_shape_arithmetic_by_constants_and_records_static_shapes():
    model = _shape_chain_model()
    folded = fold_constants(model, {"x": ((2, 3, 4), "float32")})
    assert [n.op_type for n in folded.graph.node] == ["Reshape", "Relu"]
    target = {i.name: numpy_helper.to_array(i) for i in folded.graph.initializer}[folded.graph.node[0].input[1]]
    assert target.tolist() == [2, -1]
    assert [d.dim_value for d in folded.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 4]
    assert [d.dim_value for d in folded.graph.output[0].type.tensor_type.shape.dim] == [2, 12]
    assert {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in folded.graph.value_info} == {"flat": [2, 12]}
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(onnxruntime_outputs(folded, {"x": x})["y"], onnxruntime_outputs(model, {"x": x})["y"])
    assert len(model.graph.node) == 6  # the input model is not changed


def test_fold_leaves_random_ops_graph_outputs_and_big_tensors():
    big = int(np.sqrt(MAX_FOLDED_BYTES // 4)) + 1
    nodes = [helper.make_node("RandomNormal", [], ["noise"], shape=[2, 2]),
             helper.make_node("ConstantOfShape", ["big_shape"], ["big"], value=numpy_helper.from_array(np.ones(1, np.float32))),
             helper.make_node("ReduceSum", ["big"], ["big_sum"], keepdims=0),
             helper.make_node("Add", ["one", "one"], ["two"]),
             helper.make_node("Add", ["x", "noise"], ["y"])]
    model = _model(nodes, [("x", F, [2, 2])], [("y", F, [2, 2]), ("big_sum", F, []), ("two", F, [1])],
                   [numpy_helper.from_array(np.array([big, big], np.int64), "big_shape"),
                    numpy_helper.from_array(np.ones(1, np.float32), "one")])
    folded = fold_constants(model, {"x": ((2, 2), "float32")})
    assert folded is model  # nothing folded: RandomNormal random, ConstantOfShape too big, the Add a graph output


def test_fold_without_anything_to_fold_returns_the_model():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2])], [("y", F, [2])])
    assert fold_constants(model, {"x": ((2,), "float32")}) is model


# --------------------------------------------------------------------------------------- dynamic exports


def _tiny_export(module, args, input_names, output_names, dynamic_axes) -> onnx.ModelProto:
    from tvmsched.models import real

    real._init_weights(module, np.random.default_rng(0), gain=1.0)
    return real._export(module, args, input_names, output_names, dynamic_axes)


def _dims(model: onnx.ModelProto, name: str) -> list:
    value = next(v for v in model.graph.input if v.name == name)
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_dynamic_pads_export_efficientnet_style():
    """TF 'same' padding computed from x.size() (EfficientNet-PyTorch, TF-ported MobileNets): TVM's importer
    said "Dynamic pads are not supported yet"."""
    torch = pytest.importorskip("torch")
    from tvmsched.models import real

    torch.manual_seed(0)
    module = torch.nn.Sequential(real.ConvBNAct(3, 8, 3, 2), real.MBConv(8, 8, 5, 1, 2), real.MBConv(8, 16, 3, 2, 4))
    model = _tiny_export(module, (torch.randn(1, 3, 33, 33),), ["input"], ["y"],
                         {"input": {0: "batch", 2: "height", 3: "width"}, "y": {0: "batch"}})
    assert _dims(model, "input") == ["batch", 3, "height", "width"] and any(n.op_type == "Pad" for n in model.graph.node)
    feeds = {"input": np.random.default_rng(5).standard_normal((2, 3, 30, 27)).astype(np.float32)}
    _assert_matches(model, feeds, input_shapes={"input": (2, 3, 30, 27)})


def test_dynamic_axes_bert_style_export():
    """HF-BERT-style reshapes from x.size() and a broadcast attention mask: "broadcast_to expects ..."."""
    torch = pytest.importorskip("torch")
    from tvmsched.models import real

    torch.manual_seed(0)
    module = real.Bert(vocab=100, hidden=32, layers=2, heads=4, ffn=64, positions=64)
    ids = torch.randint(0, 100, (1, 16))
    model = _tiny_export(module, (ids, torch.ones_like(ids), torch.zeros_like(ids)),
                         ["input_ids", "attention_mask", "token_type_ids"], ["hidden", "pooled"],
                         {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask", "token_type_ids")})
    rng = np.random.default_rng(6)
    mask = np.ones((3, 10), np.int64)
    mask[1:, 7:] = 0
    feeds = {"input_ids": rng.integers(0, 100, (3, 10)), "attention_mask": mask,
             "token_type_ids": rng.integers(0, 2, (3, 10))}
    _assert_matches(model, feeds, input_shapes={name: (3, 10) for name in feeds})


def test_reshape_from_shape_swin_style_export():
    """Swin's window partition reshapes from x.shape: "Reshape expects the input tensor to have known shape"."""
    torch = pytest.importorskip("torch")
    from tvmsched.models import real

    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    module = real.SwinTransformer(rng, image=32, depths=(2,), heads=(2,), dim=16, window=4, classes=10)
    model = _tiny_export(module, (torch.randn(1, 3, 32, 32),), ["input"], ["logits"], {"input": {0: "batch"}})
    _assert_matches(model, {"input": rng.standard_normal((2, 3, 32, 32)).astype(np.float32)},
                    input_shapes={"input": (2, 3, 32, 32)})


@pytest.mark.parametrize("kind", ["distilbert", "gpt2", "t5", "llama"])
def test_dynamic_axes_decoder_and_mask_exports(kind):
    """masked_fill with an expanded mask (DistilBERT), a causal mask sliced from a buffer (GPT-2), bucketed
    relative positions from arange(length) (T5), rotary tables and a triu mask from arange(seq) (Llama)."""
    torch = pytest.importorskip("torch")
    from tvmsched.models import real

    torch.manual_seed(0)
    rng = np.random.default_rng(8)
    ids = torch.randint(0, 50, (1, 12))
    if kind == "distilbert":
        module, args, names = real.DistilBert(vocab=50, dim=32, layers=2, heads=4, ffn=64, positions=64), (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    elif kind == "gpt2":
        module, args, names = real.GPT2(rng, vocab=50, dim=32, layers=2, heads=4, positions=64), (ids,), ["input_ids"]
    elif kind == "t5":
        module, args, names = real.T5(vocab=50, dim=32, layers=2, heads=4, kv_dim=8, ffn=64), (ids, torch.ones_like(ids), ids[:, :5]), ["input_ids", "attention_mask", "decoder_input_ids"]
    else:
        module, args, names = real.Llama(vocab=50, dim=32, layers=2, heads=4, kv_heads=2, ffn=48), (ids,), ["input_ids"]
    axes = {n: {0: "batch", 1: "decoder_sequence" if n.startswith("decoder") else "sequence"} for n in names}
    model = _tiny_export(module, args, names, ["y"], axes)
    shapes = {n: (2, 4 if n.startswith("decoder") else 9) for n in names}
    feeds = {n: rng.integers(0, 50, shape) for n, shape in shapes.items()}
    if "attention_mask" in feeds:
        feeds["attention_mask"] = np.ones(shapes["attention_mask"], np.int64)
        feeds["attention_mask"][1, 6:] = 0
    _assert_matches(model, feeds, input_shapes=shapes)


# --------------------------------------------------------------------------------------- refusals


def test_importer_refusal_names_the_op_and_node():
    """A Reshape whose target shape arrives at run time (nothing to fold): the one line names the node."""
    model = _model([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_at_runtime")],
                   [("x", F, [2, 6]), ("shape", I64, [2])], [("y", F, [3, 4])])
    with pytest.raises(TvmschedError) as err:
        compile_model(model)
    message = str(err.value)
    assert message.startswith("the ONNX importer rejected the model at Reshape node 'reshape_at_runtime': ")
    assert "\n" not in message


def test_lowering_refusal_names_the_relax_op_and_the_failing_assert():
    """What used to end in a bare "AssertionError": the op, its operands and the failed check."""
    from tvm.relax.frontend.onnx import from_onnx

    from tvmsched.lower import relax as lowering
    from tvmsched.lower.targets import make_target

    slope = numpy_helper.from_array(np.full(5, 0.1, np.float32), "slope")
    model = _model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [("x", F, [1, 8, 6, 6])], [("y", F, [1, 8, 6, 6])],
                   [slope])
    mod = from_onnx(model)  # TVM's importer alone: no tvmsched rewrite in between
    with pytest.raises(TvmschedError) as err:
        lowering.legalize_and_fuse(mod, make_target("llvm"))
    message = str(err.value)
    assert message.startswith("lowering the model to TIR failed: unsupported relax.nn.prelu(")
    assert "(1, 8, 6, 6)" in message and "(5,)" in message and "AssertionError (assert " in message
