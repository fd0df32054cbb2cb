"""Indices read from run-time data are bounds-checked (tvmsched.frontend.index_checks; issue 12 item 1).

Every op that indexes with run-time values gives onnxruntime's answers in range (negative indices
included) and a one-line error out of range, on every entry point; the next request is unaffected.
"""

from __future__ import annotations

import sys

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import assert_user_error, free_port, make_model, onnxruntime_outputs, run_cli, start_server, stop_server
from tvmsched.errors import TvmschedError
from tvmsched.pipeline import compile_model
from tvmsched.runtime import Executor

DATA = np.arange(5 * 6, dtype=np.float32).reshape(5, 6)
UPDATES = {"ScatterND": (2, 6), "ScatterElements": (1, 6)}


def _info(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _index_model(op: str, indices_shape, out_shape, index_type=TensorProto.INT64, **attrs):
    inputs = [_info("i", index_type, indices_shape)]
    node_inputs = ["d", "i"]
    if op in UPDATES:
        inputs.append(_info("u", TensorProto.FLOAT, UPDATES[op]))
        node_inputs.append("u")
    node = helper.make_node(op, node_inputs, ["y"], name="lookup", **attrs)
    return make_model([node], inputs, [_info("y", TensorProto.FLOAT, out_shape)], [numpy_helper.from_array(DATA, "d")])


# op, model, in-range indices (negative ones included), out-of-range indices, the range the error names
CASES = {
    "Gather": (lambda: _index_model("Gather", [3], [3, 6]), [0, -1, 4], [0, 5, 1], "[-5, 4]"),
    "Gather-int32-axis1": (
        lambda: _index_model("Gather", [2, 2], [5, 2, 2], TensorProto.INT32, axis=1),
        np.array([[0, -6], [5, 2]], np.int32), np.array([[0, -7], [5, 2]], np.int32), "[-6, 5]",
    ),
    "Gather-2**31": (lambda: _index_model("Gather", [3], [3, 6]), [1, 2, 3], [1, 2**31, 3], "[-5, 4]"),
    "GatherElements": (lambda: _index_model("GatherElements", [5, 2], [5, 2], axis=1), [[0, -1]] * 5, [[0, 6]] * 5, "[-6, 5]"),
    "GatherND": (lambda: _index_model("GatherND", [3, 2], [3]), [[0, 0], [4, 5], [-1, -6]], [[0, 0], [4, 6], [1, 1]],
                 "[-5, 4], [-6, 5]"),
    "ScatterND": (lambda: _index_model("ScatterND", [2, 1], [5, 6]), [[1], [-1]], [[1], [5]], "[-5, 4]"),
    "ScatterElements": (lambda: _index_model("ScatterElements", [1, 6], [5, 6], axis=0),
                        [[0, 1, 2, 3, 4, -5]], [[0, 1, 2, 3, 4, -6]], "[-5, 4]"),
}


def _feeds(model, indices):
    feeds = {"i": np.asarray(indices, dtype=np.int32 if model.graph.input[0].type.tensor_type.elem_type == TensorProto.INT32 else np.int64)}
    if len(model.graph.input) > 1:
        feeds["u"] = np.full(UPDATES[model.graph.node[0].op_type], 7.0, np.float32)
    return feeds


@pytest.mark.parametrize("case", list(CASES))
def test_indices_are_checked_as_onnxruntime_checks_them(compiled, reference, case):
    build, good, bad, valid = CASES[case]
    model = build()
    executor = Executor(compiled.artifact(model))
    assert [c.indices for c in executor.manifest.index_checks] == ["i"]
    feeds = _feeds(model, good)
    np.testing.assert_array_equal(executor.run(feeds)["y"], reference(model, feeds)["y"])
    with pytest.raises(Exception, match="(?i)out of|invalid ind"):  # onnxruntime refuses the same indices
        onnxruntime_outputs(model, _feeds(model, bad))
    with pytest.raises(TvmschedError) as err:
        executor.run(_feeds(model, bad))
    message = str(err.value)
    assert message == f"index out of range: {model.graph.node[0].op_type} node 'lookup' (indices 'i'): values must be in {valid}"
    # the same model serves the next request right
    np.testing.assert_array_equal(executor.run(feeds)["y"], reference(model, feeds)["y"])


def test_unchecked_compile_has_no_checks_and_one_kernel_less(compiled):
    checked = compiled.artifact(CASES["Gather"][0]())
    unchecked = compiled.artifact(CASES["Gather"][0](), index_checks=False)
    assert unchecked.manifest.index_checks == () and len(checked.manifest.index_checks) == 1
    assert len(checked.manifest.layers) == len(unchecked.manifest.layers) + 1  # the flag's reduction


def test_constant_out_of_range_index_is_a_compile_error(tmp_path):
    ids = numpy_helper.from_array(np.array([0, 5], np.int64), "ids")
    model = make_model([helper.make_node("Gather", ["d", "ids"], ["y"], name="fixed")], [_info("x", TensorProto.FLOAT, [1])],
                       [_info("y", TensorProto.FLOAT, [2, 6])], [numpy_helper.from_array(DATA, "d"), ids])
    import onnx

    onnx.save(model, tmp_path / "m.onnx")
    assert_user_error(run_cli("compile", tmp_path / "m.onnx", "-o", tmp_path / "m.tvms"),
                      "Gather node 'fixed': constant index 5 at position [1] is out of range (valid: [-5, 4])")
    assert not (tmp_path / "m.tvms").exists()


def test_cli_run_out_of_range_is_one_error_line(cli, compiled, tmp_path):
    import onnx

    model = CASES["Gather"][0]()
    onnx.save(model, tmp_path / "m.onnx")
    artifact = compiled(model, name="m")  # what `tvmsched compile m.onnx` writes
    np.savez(tmp_path / "bad.npz", i=np.array([0, 10**6, 1], np.int64))
    result = run_cli("run", artifact, "--inputs", tmp_path / "bad.npz", "--output", tmp_path / "out.npz")
    assert_user_error(result, "index out of range: Gather node 'lookup' (indices 'i'): values must be in [-5, 4]")
    assert not (tmp_path / "out.npz").exists()
    np.savez(tmp_path / "good.npz", i=np.array([0, -5, 4], np.int64))
    good = cli("run", artifact, "--inputs", tmp_path / "good.npz", "--check", tmp_path / "m.onnx")
    assert good.returncode == 0, good.stderr


def test_checked_gather_compiles_for_cuda():
    artifact = compile_model(CASES["GatherND"][0](), target="cuda")
    assert len(artifact.manifest.index_checks) == 1 and artifact.manifest.device == "cuda"


def test_embedding_models_are_checked_and_match_onnxruntime(compiled, reference):
    from tvmsched import models

    model = models.build("bert-tiny-ids")
    executor = Executor(compiled.artifact("bert-tiny-ids"))
    (check,) = executor.manifest.index_checks
    assert (check.op, check.indices, check.bounds) == ("Gather", "input_ids", (30522,))
    feeds = executor.random_inputs(2)
    assert 0 <= feeds["input_ids"].min() and feeds["input_ids"].max() < 30522
    np.testing.assert_allclose(executor.run(feeds)["output"], reference(model, feeds)["output"], rtol=1e-4, atol=1e-4)
    feeds["input_ids"][0, 7] = 30522  # the vocabulary's size: one past the table
    with pytest.raises(TvmschedError, match="values must be in \\[-30522, 30521\\]"):
        executor.run(feeds)


def test_server_answers_400_for_the_bad_request_and_keeps_serving(compiled, reference):
    from tvmsched import models

    gather = compiled(CASES["Gather"][0]())
    mlp = models.build("mlp")
    mlp_path = compiled("mlp")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server([sys.executable, "examples/server.py", "--model", f"gather={gather}:1000",
                           "--model", f"mlp={mlp_path}:1000", "--port", str(port)], base)
    try:
        infer = lambda name, inputs: httpx.post(f"{base}/v1/models/{name}/infer", json={"inputs": inputs}, timeout=60)
        for bad in (5000, 2**31, -6):
            reply = infer("gather", {"i": [0, bad, 1]})
            assert reply.status_code == 400, reply.text
            assert "index out of range: Gather node 'lookup'" in reply.json()["detail"]
        reply = infer("gather", {"i": [4, -1, 0]})
        assert reply.status_code == 200
        np.testing.assert_array_equal(np.array(reply.json()["outputs"]["y"], np.float32), DATA[[4, 4, 0]])
        x = models.random_inputs(mlp, seed=3)
        reply = infer("mlp", {k: v.tolist() for k, v in x.items()})
        assert reply.status_code == 200
        np.testing.assert_allclose(np.array(reply.json()["outputs"]["output"], np.float32), reference(mlp, x)["output"],
                                   rtol=1e-4, atol=1e-5)
        assert server.poll() is None
    finally:
        stop_server(server)


def test_onnxruntime_session_sees_the_original_model(compiled):
    """The rewrite never leaks into what a user checks against: the flag outputs are not model outputs."""
    executor = Executor(compiled.artifact(CASES["ScatterND"][0]()))
    assert [b.name for b in executor.manifest.outputs] == ["y"]
    assert list(executor.run(_feeds(CASES["ScatterND"][0](), [[0], [1]]))) == ["y"]


def test_several_checks_share_a_flag_word_and_name_the_right_node(compiled, reference):
    """Three checked Gathers: their flags are bits of one word (a chain of Adds; a variadic Sum imported as
    stack + sum); the error names the node whose indices were out of range, whichever bit it is."""
    nodes = [helper.make_node("Gather", ["d", f"i{k}"], [f"g{k}"], name=f"lookup{k}") for k in range(3)]
    nodes += [helper.make_node("Add", ["g0", "g1"], ["s"]), helper.make_node("Add", ["s", "g2"], ["y"])]
    model = make_model(nodes, [_info(f"i{k}", TensorProto.INT64, [3]) for k in range(3)], [_info("y", TensorProto.FLOAT, [3, 6])],
                       [numpy_helper.from_array(DATA, "d")])
    executor = Executor(compiled.artifact(model))
    assert [c.node for c in executor.manifest.index_checks] == ["lookup0", "lookup1", "lookup2"]
    feeds = {f"i{k}": np.array([0, -1, k], np.int64) for k in range(3)}
    np.testing.assert_array_equal(executor.run(feeds)["y"], reference(model, feeds)["y"])
    for bad in (2, 1, 0):
        wrong = {**feeds, f"i{bad}": np.array([0, 5, 1], np.int64)}
        with pytest.raises(TvmschedError, match=f"Gather node 'lookup{bad}' \\(indices 'i{bad}'\\)"):
            executor.run(wrong)
    np.testing.assert_array_equal(executor.run(feeds)["y"], reference(model, feeds)["y"])
