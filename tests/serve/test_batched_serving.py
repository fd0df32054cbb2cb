"""A model compiled for a batch, served by both servers to Triton's clients (issue 39, first slice of its serving part):
metadata with a -1 batch dimension, max_batch_size in the model configuration, requests of 1 to 8 rows from
concurrent clients answered row for row as onnxruntime answers each row alone, the engine packing them into fewer
executions (Triton's inference and execution counts apart), and a request of too many rows refused in one line.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.helpers import start_cpp_server, start_serve, stop_server
from tests.test_cpp_examples import cpp_build  # noqa: F401 (the fixture: `make cpp` once)
from tvmsched import models

tritonclient_http = pytest.importorskip("tritonclient.http")
tritonclient_grpc = pytest.importorskip("tritonclient.grpc")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException
ort = pytest.importorskip("onnxruntime")

ROWS = [1, 3, 2, 1, 4, 1, 2, 8, 1, 1, 2, 3, 1, 5, 1, 2] * 2  # per request


@pytest.fixture(scope="module")
def repository(tmp_path_factory, compiled):
    root = tmp_path_factory.mktemp("repository")
    (root / "mlp8").mkdir()
    (root / "mlp8" / "mlp8.tvms").symlink_to(compiled("mlp", batch_size=8))  # the shared artifact, read only
    (root / "mlp8" / "config.json").write_text('{"max_queue": 64, "max_queue_delay_us": 2000}')
    return root


@pytest.fixture(scope="module")
def serve_server(repository):
    process, base, grpc = start_serve("--model-repository", str(repository))
    yield base, grpc
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def cpp_server(cpp_build, repository):  # noqa: F811
    process, base = start_cpp_server(cpp_build / "tvmsched_server", "--model-repository", str(repository))
    yield base, None
    assert stop_server(process) == 0


@pytest.fixture(params=["serve-http", "serve-grpc", "cpp-http"])
def client(request):
    """(tritonclient module, a client factory): each thread makes its own (the HTTP client's gevent loop is per
    thread)."""
    server, protocol = request.param.split("-")
    http, grpc = request.getfixturevalue(f"{server}_server")
    module = tritonclient_grpc if protocol == "grpc" else tritonclient_http
    return module, lambda: module.InferenceServerClient(grpc if protocol == "grpc" else http.removeprefix("http://"))


def _alone(rows: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(models.build("mlp").SerializeToString(), providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"input": rows[i : i + 1]})[0] for i in range(len(rows))])


def _stats(module, client) -> dict:
    stats = client.get_inference_statistics("mlp8", as_json=True) if module is tritonclient_grpc else \
        client.get_inference_statistics("mlp8")
    s = stats["model_stats"][0]
    batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in s.get("batch_stats", [])}
    return {"inferences": int(s.get("inference_count", 0)), "executions": int(s.get("execution_count", 0)),
            "success": int(s["inference_stats"]["success"].get("count", 0)), "batches": batches}


def test_a_batched_model_answers_concurrent_requests_of_several_rows_as_each_row_alone(client):
    module, make = client
    client = make()
    meta = client.get_model_metadata("mlp8", as_json=True) if module is tritonclient_grpc else \
        client.get_model_metadata("mlp8")
    assert [(t["name"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == [("input", [-1, 784])]
    config = client.get_model_config("mlp8", as_json=True) if module is tritonclient_grpc else \
        client.get_model_config("mlp8")
    config = config.get("config", config)
    assert int(config["max_batch_size"]) == 8 and [int(d) for d in config["input"][0]["dims"]] == [784]
    assert int(config["dynamic_batching"]["max_queue_delay_microseconds"]) == 2000
    before = _stats(module, client)
    rng = np.random.default_rng(0)
    sent = [rng.standard_normal((n, 784)).astype(np.float32) for n in ROWS]

    def infer(rows: np.ndarray, client=None) -> np.ndarray:
        own = client is None
        client = make() if own else client
        try:
            tensor = module.InferInput("input", list(rows.shape), "FP32")
            tensor.set_data_from_numpy(rows)
            return client.infer("mlp8", [tensor]).as_numpy("output")
        finally:
            if own:
                client.close()

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(infer, sent))
    for rows, got in zip(sent, answers):
        assert got.shape == (len(rows), 10)
        np.testing.assert_allclose(got, _alone(rows), rtol=1e-4, atol=1e-5)
    after = _stats(module, client)
    assert after["success"] - before["success"] == len(ROWS)
    assert after["inferences"] - before["inferences"] == sum(ROWS)  # Triton's inference count: rows
    assert 0 < after["executions"] - before["executions"] < len(ROWS)  # they share launches: a free stream waits 2 ms
    batches = after["batches"]  # Triton's batch_stats: the launches by the rows they brought
    assert sum(batches.values()) == after["executions"] and sum(r * n for r, n in batches.items()) == after["inferences"]
    assert set(batches) <= set(range(1, 9))
    with pytest.raises(InferenceServerException) as refused:
        infer(np.zeros((9, 784), np.float32), client)
    assert "has 9 rows: the model takes 1 to 8 rows per request" in str(refused.value)
    assert "\n" not in str(refused.value)
    client.close()
