"""The CLI end to end, and every kind of bad input: one stderr line, exit code 2, no traceback."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.helpers import assert_user_error, make_model, relu_gemm_model, run_cli
from tests.test_artifact import bump_schema, rewrite_member


@pytest.fixture(scope="module")
def static(tmp_path_factory, compiled):
    """A static-shape model and its artifact (what `tvmsched compile m.onnx` writes, from the shared cache):
    (onnx path, read-only artifact path)."""
    folder = tmp_path_factory.mktemp("cli")
    model_path = folder / "m.onnx"
    onnx.save(relu_gemm_model(dims=(2, 8)), model_path)
    return model_path, compiled(relu_gemm_model(dims=(2, 8)), name="m")


def test_models_build_compile_run_inspect(cli, tmp_path):
    # `models list` and `models build` import torch (tvmsched.models.real), whose import adds logging handlers to
    # its loggers: in a process of their own until that import is lazy (the cli fixture would see them left behind)
    assert "resnet18-small" in run_cli("models", "list").stdout
    model = tmp_path / "mlp.onnx"
    assert run_cli("models", "build", "mlp", "-o", model).returncode == 0
    result = cli("compile", model)
    assert result.returncode == 0, result.stderr
    artifact = tmp_path / "mlp.tvms"
    assert "4 layers" in result.stdout and artifact.exists()
    inputs, outputs = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, input=np.random.default_rng(0).standard_normal((1, 784)).astype(np.float32))
    result = cli("run", artifact, "--inputs", inputs, "--output", outputs, "--repeat", "5", "--check", model)
    assert result.returncode == 0, result.stderr
    assert "-> OK" in result.stdout and "p50" in result.stdout and "p99" in result.stdout
    with np.load(outputs) as saved:
        assert saved["output"].shape == (1, 10)
        np.testing.assert_allclose(saved["output"].sum(), 1.0, rtol=1e-5)  # softmax
    summary = json.loads(cli("run", artifact, "--inputs", inputs, "--repeat", "7", "--check", model, "--json").stdout)
    assert summary["runs"] == 7 and 0 < summary["min_ms"] <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert summary["check"]["ok"] and summary["outputs"]["output"]["shape"] == [1, 10]
    manifest = json.loads(cli("inspect", artifact, "--json").stdout)
    assert [layer["candidates"][0]["id"] for layer in manifest["layers"]] == [0] * 4
    assert "MFLOP" in cli("inspect", artifact).stdout


def test_missing_model_file(tmp_path):
    assert_user_error(run_cli("compile", tmp_path / "nope.onnx"), "model file not found")


def test_not_an_onnx_file(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\x08\x07this is not a protobuf \xff\xfe" * 10)
    assert_user_error(run_cli("compile", path), "junk.onnx", "ONNX")


def test_model_failing_the_checker(tmp_path):
    model = make_model(
        [helper.make_node("Relu", ["undefined_tensor"], ["y"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    assert_user_error(run_cli("compile", path), "fails the ONNX checker")


def test_unsupported_op_names_op_and_node(tmp_path):
    model = make_model(
        [helper.make_node("Celu", ["x"], ["y"], name="my_celu")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    path = tmp_path / "celu.onnx"
    onnx.save(model, path)
    assert_user_error(run_cli("compile", path), "unsupported op Celu", "my_celu")


def test_dynamic_input_shape_is_named_and_fixable(cli, tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(relu_gemm_model(dims=("N", 8)), path)
    assert_user_error(run_cli("compile", path), "input 'x' has a dynamic shape", "--input-shape")
    result = cli("compile", path, "--input-shape", "x=3,8")
    assert result.returncode == 0, result.stderr
    result = cli("run", tmp_path / "dyn.tvms", "--check", path)
    assert result.returncode == 0 and "shape (3, 4)" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize(
    "value, fragment",
    [("x=a,b", "not of the form"), ("x", "not of the form"), ("x=0,8", "positive"), ("nope=1,8", "unknown input")],
)
def test_bad_input_shape_option(tmp_path, value, fragment):
    path = tmp_path / "dyn.onnx"
    onnx.save(relu_gemm_model(dims=("N", 8)), path)
    assert_user_error(run_cli("compile", path, "--input-shape", value), fragment)


def test_unknown_target(static):
    model_path, _ = static
    assert_user_error(run_cli("compile", model_path, "--target", "no-such-target"), "unknown target")
    assert_user_error(run_cli("compile", model_path, "--target", "{oops"), "not valid JSON")


def test_loop_checks_need_a_count_and_preempt_checks(static):
    model_path, _ = static
    assert_user_error(run_cli("compile", model_path, "--loop-checks", "-1"), "--loop-checks", "-1")
    assert_user_error(run_cli("compile", model_path, "--loop-checks"), "--loop-checks")
    assert_user_error(run_cli("compile", model_path, "--loop-checks", "4", "--no-preempt-checks"),
                      "--loop-checks 4: give K >= 1 (checks per loop) with preempt checks on, or 0")


@pytest.mark.parametrize(
    "arrays, fragment",
    [
        ({"z": np.zeros((2, 8), np.float32)}, "input names do not match"),
        ({"x": np.zeros((3, 8), np.float32)}, "has shape (3, 8), expected (2, 8)"),
        ({"x": np.zeros((2, 8), np.float64)}, "has dtype float64, expected float32"),
    ],
)
def test_wrong_inputs_at_run_time(static, tmp_path, arrays, fragment):
    _, artifact = static
    inputs = tmp_path / "in.npz"
    np.savez(inputs, **arrays)
    assert_user_error(run_cli("run", artifact, "--inputs", inputs), fragment)


def test_unreadable_inputs_file(static, tmp_path):
    _, artifact = static
    inputs = tmp_path / "in.npz"
    inputs.write_text("not an npz")
    assert_user_error(run_cli("run", artifact, "--inputs", inputs), "cannot read inputs")


def test_missing_artifact(tmp_path):
    assert_user_error(run_cli("run", tmp_path / "none.tvms"), "artifact not found")
    assert_user_error(run_cli("inspect", tmp_path / "none.tvms"), "artifact not found")


def test_truncated_artifact(static, tmp_path):
    _, artifact = static
    broken = tmp_path / "cut.tvms"
    broken.write_bytes(artifact.read_bytes()[:1000])
    assert_user_error(run_cli("run", broken), "truncated or corrupt")


def test_tampered_artifact(static, tmp_path):
    _, artifact = static
    tampered = tmp_path / "tampered.tvms"
    tampered.write_bytes(artifact.read_bytes())
    rewrite_member(tampered, "kernels.so", lambda data: data.replace(b"ELF", b"ELG", 1))
    assert_user_error(run_cli("run", tampered), "checksum mismatch in kernels.so")


def test_artifact_from_a_newer_schema(static, tmp_path):
    _, artifact = static
    newer = tmp_path / "newer.tvms"
    newer.write_bytes(artifact.read_bytes())
    rewrite_member(newer, "manifest.json", bump_schema, fix_checksum=True)
    assert_user_error(run_cli("inspect", newer), "newer than this tvmsched reads")


def test_unknown_zoo_model(tmp_path):
    assert_user_error(run_cli("models", "build", "resnet1000", "-o", tmp_path / "x.onnx"), "resnet1000")


def test_cuda_device_for_a_cpu_artifact(static):
    _, artifact = static
    assert_user_error(run_cli("run", artifact, "--device", "cuda"), "compiled for cpu, not cuda")


def test_check_fails_on_wrong_numbers_and_on_another_model(cli, compiled, tmp_path):
    """--check is a real relative tolerance: the mlp with other weights (softmax outputs ~0.1 apart by
    ~0.01) is a MISMATCH, not 'within 100% of the reference'; a model with other outputs is one line."""
    from tvmsched import models

    same, reseeded = tmp_path / "mlp.onnx", tmp_path / "mlp-seed1.onnx"
    models.save("mlp", same, seed=0)
    models.save("mlp", reseeded, seed=1)
    artifact = compiled("mlp")  # what `tvmsched compile mlp.onnx` writes
    assert cli("run", artifact, "--check", same).returncode == 0
    assert_user_error(run_cli("run", artifact, "--check", reseeded), "outputs differ from onnxruntime", "elements")
    other = tmp_path / "tiny.onnx"
    models.save("tiny", other)
    assert_user_error(run_cli("run", artifact, "--check", other), "not the same model")


def test_check_rejects_all_zero_outputs_and_accepts_identical_nans(tmp_path):
    """All-zero outputs were 'OK' under |out - ref| <= 1e-4 + |ref| (100% relative error)."""
    import onnxruntime

    from tvmsched import models
    from tvmsched.cli.main import _check_against_onnxruntime
    from tvmsched.errors import TvmschedError

    path = tmp_path / "mlp.onnx"
    models.save("mlp", path)
    inputs = models.random_inputs(models.build("mlp"), seed=0)
    reference = onnxruntime.InferenceSession(str(path)).run(None, inputs)[0]
    quiet = lambda text: None
    assert _check_against_onnxruntime(str(path), inputs, {"output": reference.copy()}, echo=quiet)["ok"]
    with pytest.raises(TvmschedError, match="outputs differ from onnxruntime"):
        _check_against_onnxruntime(str(path), inputs, {"output": np.zeros_like(reference)}, echo=quiet)
    with pytest.raises(TvmschedError, match="outputs differ from onnxruntime"):
        _check_against_onnxruntime(str(path), inputs, {"output": reference * 1.01}, echo=quiet)
    nan_inputs = {"input": np.full_like(inputs["input"], np.nan)}
    nan_reference = onnxruntime.InferenceSession(str(path)).run(None, nan_inputs)[0]
    assert np.isnan(nan_reference).all()
    assert _check_against_onnxruntime(str(path), nan_inputs, {"output": nan_reference.copy()}, echo=quiet)["ok"]


def test_run_output_is_written_under_exactly_the_given_name(cli, static, tmp_path):
    _, artifact = static
    result = cli("run", artifact, "--output", tmp_path / "result")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "result").is_file() and not (tmp_path / "result.npz").exists()  # np.savez appended .npz
    with np.load(tmp_path / "result") as saved:
        assert saved.files == ["y"] and saved["y"].shape == (2, 4)


def test_output_into_a_missing_folder_fails_before_any_work(static, tmp_path):
    model, artifact = static
    result = run_cli("run", artifact, "--output", tmp_path / "no" / "out.npz")
    assert_user_error(result, "cannot write", "folder", "does not exist")
    assert result.stdout == ""  # it used to print the outputs, then fail with a traceback
    assert_user_error(run_cli("compile", model, "-o", tmp_path / "no" / "m.tvms"), "does not exist")


def test_a_failed_import_leaves_no_tvm_warning_after_the_error_line():
    """The importer's half-built BlockBuilder warned when freed, after the CLI's error line."""
    import subprocess
    import sys

    script = """
from onnx import TensorProto, helper
from tests.helpers import make_model
from tvmsched.errors import TvmschedError
from tvmsched.frontend.loader import import_model
value = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
model = make_model([helper.make_node("Concat", ["a", "b"], ["y"], axis=0)], [value("a", [2, 3]), value("b", [2, 3, 4])], [value("y", [4, 3])])
try:
    import_model(model, {"a": ((2, 3), "float32"), "b": ((2, 3, 4), "float32")})
except TvmschedError as err:
    print("error:", err, file=sys.stderr)
"""
    result = subprocess.run([sys.executable, "-c", "import sys\n" + script], capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the ONNX importer rejected the model"), result.stderr


def test_run_check_with_repeat_times_onnxruntime_side_by_side(cli, static):
    """issue 16: `run --check M.onnx --repeat N` times onnxruntime on the same inputs and threads and prints
    both latencies and their ratio; the first latency line and the JSON keys of before stay as they were."""
    model, artifact = static
    result = cli("run", artifact, "--check", model, "--repeat", "3")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("latency over 3 runs: p50 ") for line in lines)
    assert any(line.startswith("side by side over 3 runs, same inputs, ") for line in lines)
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("  ") and line.split()}
    assert set(rows) >= {"tvmsched", "onnxruntime", "tvmsched/onnxruntime"}
    assert all(float(v) >= 0 for v in rows["tvmsched"] + rows["onnxruntime"])
    assert all(v.endswith("x") for v in rows["tvmsched/onnxruntime"])
    summary = json.loads(cli("run", artifact, "--check", model, "--repeat", "4", "--json").stdout)
    compare = summary["compare"]
    assert summary["runs"] == 4 and compare["onnxruntime"]["runs"] == 4 and compare["threads"] >= 1
    assert compare["ratio_p50"] == pytest.approx(summary["p50_ms"] / compare["onnxruntime"]["p50_ms"])
    plain = cli("run", artifact, "--repeat", "2")  # no model to compare with: no onnxruntime timing
    assert plain.returncode == 0 and "onnxruntime" not in plain.stdout and "p50" in plain.stdout


def test_onnxruntime_timed_with_the_runtime_threads(static):
    """The reference session: intra-op threads = the engine's, one inter-op thread, sequential."""
    import os

    import onnxruntime

    from tvmsched.cli import compare

    model, _ = static
    assert compare.runtime_threads("cpu") == int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count())
    options = compare.onnxruntime_session(str(model), 1).get_session_options()
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    assert options.execution_mode == onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    table = compare.side_by_side([0.004, 0.006], [0.001, 0.001], threads=1)  # p50 5 ms, p99 5.98 ms against 1 ms
    assert table["ratio_p50"] == pytest.approx(5.0) and table["tvmsched"]["runs"] == 2
    assert compare.format_table(table)[-1].split()[-2:] == ["5.00x", "5.98x"]
