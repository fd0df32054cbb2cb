"""Compiling for a batch of rows (issue 39, step 1; tvmsched.frontend.batching): the batch dimension found, the model
rewritten for B rows and checked row by row against onnxruntime; a model whose rows are not computed independently is
refused in one line naming the node."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_user_error
from tvmsched import models
from tvmsched.errors import TvmschedError
from tvmsched.frontend import batching
from tvmsched.runtime import Executor, Runtime

ort = pytest.importorskip("onnxruntime")

ZOO = [("mlp", 8), ("bert-tiny", 2), ("resnet18-small", 4)]  # the zoo as built: bert-tiny keeps Reshape [1, 128, 2, 64]


def _alone(model: onnx.ModelProto, inputs: dict, row: int) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {name: value[row : row + 1] for name, value in inputs.items()}
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.mark.parametrize("name,size", ZOO, ids=[name for name, _ in ZOO])
def test_a_zoo_model_compiled_for_b_rows_answers_every_row_as_onnxruntime_does_alone(compiled, name, size):
    executor = Executor(str(compiled(name, batch_size=size)))
    assert executor.manifest.batch_size == size
    inputs = executor.random_inputs(1)
    assert all(value.shape[0] == size for value in inputs.values())
    outputs = executor.run(inputs)
    model = models.build(name)
    for row in range(size):
        for output, want in _alone(model, inputs, row).items():
            np.testing.assert_allclose(outputs[output][row : row + 1], want, rtol=1e-4, atol=1e-5, err_msg=f"row {row}")


@pytest.mark.parametrize("name,size", ZOO, ids=[name for name, _ in ZOO])
def test_a_row_is_the_same_bits_at_any_position_beside_any_other_rows(compiled, name, size):
    executor = Executor(str(compiled(name, batch_size=size)))
    row = {k: v[:1] for k, v in executor.random_inputs(3).items()}
    seen = []
    for position in range(size):
        for seed in (1, 2):  # two different neighbours
            inputs = executor.random_inputs(seed)
            for k in inputs:
                inputs[k][position] = row[k][0]
            seen.append({k: v[position] for k, v in executor.run(inputs).items()})
    assert all(np.array_equal(got[k], seen[0][k]) for got in seen for k in got)


def test_the_rewrite_replaces_only_the_reshape_targets_that_carry_the_batch():
    batched = batching.rebatch(models.build("bert-tiny"), 4)
    assert batched.input_shapes == {"hidden_states": (4, 128, 128)}
    assert len(batched.rewritten) == 8 and all("attn" in node for node in batched.rewritten)  # q, k, v and merged
    targets = {init.name: numpy_helper.to_array(init) for init in batched.model.graph.initializer}
    reshapes = [node for node in batched.model.graph.node if node.op_type == "Reshape"]
    assert all(targets[node.input[1]][0] == 4 for node in reshapes if node.name in batched.rewritten)
    assert batching.rebatch(models.build("mlp"), 4).rewritten == ()  # nothing to rewrite: its first dim is the input's


def test_a_real_architecture_exported_with_dynamic_axes_compiles_for_b_rows(compiled):
    spec = models.REAL_MODELS["bert-4l"]  # HF-style BERT: symbolic batch and sequence, shape arithmetic in the graph
    model = onnx.load(models.real_model_path("bert-4l", seed=0))
    shapes = {name: (1, *shape[1:]) for name, shape in spec.input_shapes.items()}
    batching.check_rows(model, shapes)
    assert batching.rebatch(model, 3, shapes).rewritten == ()  # its Reshapes are computed from Shape: folded later
    executor = Executor(str(compiled(model, name="bert-4l", input_shapes=shapes, batch_size=3)))
    feeds = {name: np.stack([value[0]] * 3) for name, value in models.real_inputs("bert-4l", seed=0).items()}
    feeds["input_ids"][1] = (feeds["input_ids"][1] + 7) % 1000  # three different rows
    feeds["input_ids"][2] = (feeds["input_ids"][2] + 13) % 1000
    outputs = executor.run(feeds)
    for row in range(3):
        for output, want in _alone(model, feeds, row).items():
            scale = float(np.abs(want).max())
            np.testing.assert_allclose(outputs[output][row : row + 1], want, rtol=1e-3, atol=1e-4 * scale)
    rt = Runtime()  # three inputs: a request's must agree on its rows
    try:
        rt.load(str(compiled(model, name="bert-4l", input_shapes=shapes, batch_size=3)), name="bert-4l")
        torn = {name: value[:2] if name == "input_ids" else value for name, value in feeds.items()}
        with pytest.raises(TvmschedError, match="^the inputs' batch dimensions disagree: input '"):
            rt.submit("bert-4l", torn).result(timeout=60)
        two = rt.submit("bert-4l", {name: value[:2] for name, value in feeds.items()}).result(timeout=60)
        assert all(np.array_equal(two[k], outputs[k][:2]) for k in outputs)  # the same rows, the same bits
    finally:
        rt.shutdown()


def _model(nodes, initializers=(), shape=(1, 4, 8), out_shape=None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


REFUSED = {
    "softmax over the batch": (_model([helper.make_node("Softmax", ["x"], ["y"], axis=0, name="sm")]),
                               "Softmax node 'sm' mixes the rows of a batch"),
    "mean over the batch": (_model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], name="rm")]),
                            "ReduceMean node 'rm' reduces over the batch"),
    "reshape folding it": (_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="flat")],
                                  [_const("s", np.array([-1], np.int64))]),
                           "Reshape node 'flat' folds the batch into another dimension: its output is [32] for one "
                           "row and [64] for two"),
    "a constant row": (_model([helper.make_node("Concat", ["x", "c"], ["y"], axis=0, name="cat")],
                              [_const("c", np.zeros((1, 4, 8), np.float32))]),
                       "Concat node 'cat' folds the batch"),
    "batch not first in an output": (_model([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0, 2], name="tr")]),
                                     "Transpose node 'tr' writes a graph output with the batch in dimension 1"),
    "a fixed first dimension": (_model([helper.make_node("Relu", ["x"], ["y"], name="r")], shape=(4, 8)),
                                "input 'x' has first dimension 4"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_model_whose_rows_are_not_independent_is_refused_naming_the_node(case):
    model, message = REFUSED[case]
    with pytest.raises(TvmschedError, match="^cannot batch the model: ") as refused:
        batching.check_rows(model)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_symbolic_batch_with_row_wise_ops_passes():
    model = _model([helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="sm")], shape=("N", 4, 8))
    batching.check_rows(model)
    assert batching.rebatch(model, 5).input_shapes == {"x": (5, 4, 8)}


def test_the_cli_compiles_checks_and_inspects_a_batched_artifact_and_refuses_bad_sizes(cli, compiled, tmp_path):
    model = tmp_path / "bert-tiny.onnx"
    onnx.save(models.build("bert-tiny"), model)
    artifact = compiled("bert-tiny", batch_size=2)
    checked = cli("run", artifact, "--check", model)  # onnxruntime runs the ONNX file rewritten the same way
    assert checked.returncode == 0 and "-> OK" in checked.stdout, checked.stderr
    assert "batch size 2 (every input's first dimension)" in cli("inspect", artifact).stdout
    for sizes, fragment in (("0", "is not a comma-separated list of row counts from 1 to 1048576"),
                            ("two", "is not a comma-separated list"), ("2,2", "a size is given twice"),
                            (",".join(map(str, range(1, 18))), "at most 16 sizes in one artifact")):
        assert_user_error(cli("compile", model, "--batch-sizes", sizes, "-o", tmp_path / "x.tvms"), fragment)
    refused = tmp_path / "softmax0.onnx"
    onnx.save(_model([helper.make_node("Softmax", ["x"], ["y"], axis=0, name="sm")], out_shape=[1, 4, 8]), refused)
    assert_user_error(cli("compile", refused, "--batch-sizes", "4", "-o", tmp_path / "x.tvms"),
                      "cannot batch the model: Softmax node 'sm' mixes the rows of a batch")
    assert not (tmp_path / "x.tvms").exists()
