"""The C++ examples (examples/cpp, built by `make cpp`) and the /metrics endpoint of both example servers.

tvmsched_run and tvmsched_server embed the native engine; their numerics are checked against onnxruntime.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ROOT, assert_user_error, free_port, start_server, stop_server
from tvmsched import models

BUILD = ROOT / "build" / "cpp"
PACKAGES = ("libcpp-httplib-dev", "nlohmann-json3-dev", "libprotobuf-dev", "protobuf-compiler")  # the Makefile's CPP_PACKAGES


def _packages_installed() -> bool:
    return subprocess.run(["dpkg", "-s", *PACKAGES], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def cpp_build() -> Path:
    """`make cpp` once (a lock keeps pytest-xdist workers from building at the same time)."""
    for tool in ("cmake", "make", "c++"):
        if shutil.which(tool) is None:
            pytest.skip(f"the C++ examples need {tool}, which is not installed")
    if shutil.which("dpkg") is None:
        pytest.skip("the C++ examples need Debian's packages (no dpkg here)")
    if not _packages_installed() and os.geteuid() != 0 and shutil.which("sudo") is None:
        pytest.skip(f"the C++ examples need {' '.join(PACKAGES)}, which are not installed and cannot be (not root)")
    (ROOT / "build").mkdir(exist_ok=True)
    with open(ROOT / "build" / "cpp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(["make", "cpp"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    for name in ("tvmsched_run", "tvmsched_server"):
        assert (BUILD / name).is_file(), name
    return BUILD


@pytest.fixture(scope="module")
def mlp(compiled):
    """The zoo's mlp: (ONNX model, artifact path (shared, read only), inputs)."""
    model = models.build("mlp")
    return model, compiled(model, name="mlp"), models.random_inputs(model, seed=0)


def _sample(metrics_text: str, name: str, **labels) -> float:
    """The value of sample `name` with `labels` in Prometheus text (KeyError if absent)."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise KeyError(f"{name}{labels} not in:\n{metrics_text}")


def test_tvmsched_run_matches_onnxruntime(cpp_build, mlp, tmp_path, reference):
    model, artifact, inputs = mlp
    np.savez(tmp_path / "in.npz", **inputs)
    result = subprocess.run([str(cpp_build / "tvmsched_run"), str(artifact), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    expected = reference(model, inputs)
    with np.load(tmp_path / "out.npz") as outputs:
        assert sorted(outputs.files) == sorted(expected)
        for name, value in expected.items():
            assert outputs[name].dtype == value.dtype and outputs[name].shape == value.shape
            np.testing.assert_allclose(outputs[name], value, rtol=1e-4, atol=1e-4)


def test_tvmsched_run_bad_input_is_one_error_line(cpp_build, mlp, tmp_path):
    _, artifact, inputs = mlp
    run = lambda *args: subprocess.run([str(cpp_build / "tvmsched_run"), *map(str, args)], capture_output=True, text=True, timeout=120)
    np.savez(tmp_path / "names.npz", nope=inputs["input"])
    assert_user_error(run(artifact, tmp_path / "names.npz", tmp_path / "out.npz"), "input names do not match", "'nope'")
    np.savez(tmp_path / "shape.npz", input=np.zeros((2, *inputs["input"].shape[1:]), np.float32))
    assert_user_error(run(artifact, tmp_path / "shape.npz", tmp_path / "out.npz"), "input 'input' has shape")
    assert_user_error(run(artifact, tmp_path / "missing.npz", tmp_path / "out.npz"), "missing.npz")
    assert_user_error(run(tmp_path / "missing.tvms", tmp_path / "names.npz", tmp_path / "out.npz"), "artifact not found")
    assert_user_error(run(artifact), "usage")
    assert not (tmp_path / "out.npz").exists()


def test_tvmsched_server_infers_and_counts(cpp_build, mlp, reference):
    model, artifact, inputs = mlp
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server([str(cpp_build / "tvmsched_server"), "--model", f"mlp={artifact}:1000", "--port", str(port)], base)
    try:
        reply = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {k: v.tolist() for k, v in inputs.items()}}, timeout=60)
        assert reply.status_code == 200, reply.text
        expected = reference(model, inputs)["output"]
        np.testing.assert_allclose(np.array(reply.json()["outputs"]["output"], dtype=np.float32), expected, rtol=1e-4, atol=1e-4)

        _assert_one_request_counted(base)

        # the error contract of examples/server.py
        bad = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {"nope": [1, 2]}}, timeout=60)
        assert bad.status_code == 400 and "input names do not match" in bad.json()["detail"]
        assert httpx.post(f"{base}/v1/models/none/infer", json={"inputs": {}}, timeout=60).json() == {"detail": "no model named 'none' is loaded (loaded: mlp)"}
        assert httpx.post(f"{base}/v1/models/mlp/infer", json={"input": {}}, timeout=60).status_code == 422
        assert httpx.get(f"{base}/v1/stats", timeout=10).json()["mlp"]["requests"] == 1
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert _sample(metrics, "tvmsched_requests_total", model="mlp") == 2
        assert _sample(metrics, "tvmsched_errors_total", model="mlp") == 1
    finally:
        assert stop_server(server) == 0


def _assert_one_request_counted(base: str) -> None:
    """/metrics after one successful mlp request: the same series in both servers."""
    metrics = httpx.get(f"{base}/metrics", timeout=10)
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert _sample(metrics.text, "tvmsched_requests_total", model="mlp") == 1
    assert _sample(metrics.text, "tvmsched_errors_total", model="mlp") == 0
    assert _sample(metrics.text, "tvmsched_preemptions_total", model="mlp") == 0
    assert _sample(metrics.text, "tvmsched_request_latency_seconds_count", model="mlp") == 1
    assert _sample(metrics.text, "tvmsched_busy_streams", device="cpu") == 0


def test_python_server_metrics(mlp, tmp_path):
    model, artifact, inputs = mlp
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server([sys.executable, "examples/server.py", "--model", f"mlp={artifact}:1000", "--port", str(port)], base)
    try:
        reply = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {k: v.tolist() for k, v in inputs.items()}}, timeout=60)
        assert reply.status_code == 200, reply.text
        _assert_one_request_counted(base)
        unknown = httpx.post(f"{base}/v1/models/none/infer", json={"inputs": {}}, timeout=60)  # (the C++ server's line)
        assert unknown.status_code == 404 and unknown.json() == {"detail": "no model named 'none' is loaded (loaded: mlp)"}
    finally:
        stop_server(server)


@pytest.fixture(scope="module")
def gather(tmp_path_factory, compiled):
    """A Gather over a 5x6 table, compiled and signed: (artifact, public key, other public key, unsigned artifact)."""
    from onnx import TensorProto, helper, numpy_helper

    from tests.helpers import make_model
    from tvmsched.artifact.signing import generate_keys, load_private_key

    folder = tmp_path_factory.mktemp("gather")
    table = numpy_helper.from_array(np.arange(30, dtype=np.float32).reshape(5, 6), "d")
    model = make_model([helper.make_node("Gather", ["d", "i"], ["y"], name="lookup")],
                       [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])], [table])
    artifact = compiled.artifact(model, name="gather")  # saved (signed and not) into a folder of its own
    private, public, _ = generate_keys(folder / "me")
    _, other, _ = generate_keys(folder / "other")
    artifact.save(folder / "gather.tvms", load_private_key(private))
    artifact.save(folder / "unsigned.tvms")
    return folder / "gather.tvms", public, other, folder / "unsigned.tvms"


def test_tvmsched_run_checks_indices_and_signatures(cpp_build, gather, tmp_path):
    artifact, key, other, unsigned = gather
    run = lambda *args: subprocess.run([str(cpp_build / "tvmsched_run"), *map(str, args)], capture_output=True, text=True, timeout=120)
    np.savez(tmp_path / "good.npz", i=np.array([0, -1, 4]))
    np.savez(tmp_path / "bad.npz", i=np.array([0, 2**31, 4]))
    assert run("--trust", key, artifact, tmp_path / "good.npz", tmp_path / "out.npz").returncode == 0
    with np.load(tmp_path / "out.npz") as out:
        np.testing.assert_array_equal(out["y"], np.arange(30, dtype=np.float32).reshape(5, 6)[[0, 4, 4]])
    assert_user_error(run(artifact, tmp_path / "bad.npz", tmp_path / "bad-out.npz"),
                      "index out of range: Gather node 'lookup' (indices 'i'): values must be in [-5, 4]")
    assert not (tmp_path / "bad-out.npz").exists()
    assert_user_error(run("--trust", other, artifact, tmp_path / "good.npz", tmp_path / "o.npz"), "which is not trusted")
    assert_user_error(run("--trust", key, unsigned, tmp_path / "good.npz", tmp_path / "o.npz"), "is not signed")


@pytest.mark.parametrize("server", ["cpp", "python"])
def test_servers_refuse_large_bodies_and_bad_indices_per_request(cpp_build, gather, server):
    artifact, key, _, unsigned = gather
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(cpp_build / "tvmsched_server")] if server == "cpp" else [sys.executable, "examples/server.py"]
    refused = subprocess.run([*command, "--model", f"u={unsigned}", "--trust", str(key), "--port", str(port)],
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_user_error(refused, "is not signed")
    proc = start_server([*command, "--model", f"gather={artifact}", "--trust", str(key), "--port", str(port),
                          "--max-body-bytes", "300000"], base)
    try:
        infer = lambda body: httpx.post(f"{base}/v1/models/gather/infer", content=body,
                                        headers={"content-type": "application/json"}, timeout=60)
        big = infer(b'{"inputs": {"i": [' + b"0, " * 100000 + b"0]}}")
        assert big.status_code == 413
        chunked = httpx.post(f"{base}/v1/models/gather/infer", content=iter([b'{"inputs": {"i": [', b"0, " * 100000, b"0]}}"]),
                             headers={"content-type": "application/json"}, timeout=60)
        # a chunked body is cut off as it passes the limit (Debian's cpp-httplib answers that with 400)
        assert chunked.status_code in ({413} if server == "python" else {400, 413})
        deep = infer(b'{"inputs": {"i": ' + b"[" * 100000 + b"]" * 100000 + b"}}")  # killed the C++ server (stack)
        detail = {"cpp": "the body nests deeper than 64 levels",  # as tvmsched serve's /v1 (issue 38)
                  "python": "There was an error parsing the body"}[server]  # FastAPI's own answer (RecursionError)
        assert deep.status_code == 400 and deep.json() == {"detail": detail}
        for bad in (5000, 2**31, -6):
            reply = infer(b'{"inputs": {"i": [0, %d, 1]}}' % bad)
            assert reply.status_code == 400 and "index out of range: Gather node 'lookup'" in reply.json()["detail"]
        good = infer(b'{"inputs": {"i": [4, -1, 0]}}')
        assert good.status_code == 200
        assert np.array_equal(np.array(good.json()["outputs"]["y"], np.float32), np.arange(30, dtype=np.float32).reshape(5, 6)[[4, 4, 0]])
        assert proc.poll() is None
    finally:
        stop_server(proc)
