"""The same tritonclient tests against both servers (issue 38): `tvmsched serve` and build/cpp/tvmsched_server, started
from one model repository (the same folders and config keys) with the same policy, both over the engine's Runtime.

Each test runs once per server: metadata and Triton's model configuration (streams as the instance count, the policy,
the placement), outputs bit-identical to a direct engine run in binary and JSON, per-request priority and timeout
parameters, a model on two streams under concurrent clients, statistics that count what was answered, and one-line
errors for an unknown model and a wrong shape. The C++ half is skipped where the C++ examples cannot be built
(tests/test_cpp_examples.py's fixture).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from tests.helpers import free_port, start_server, stop_server
from tests.serve.test_cpp_server import _tensors, zoo  # noqa: F401 (the fixture: mlp and bert-tiny, shared artifacts)
from tests.test_cpp_examples import cpp_build  # noqa: F401 (the fixture: `make cpp` once)

tritonclient_http = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

POLICY = "colocation"
CONFIGS = {"mlp": ("config.toml", 'priority = "best_effort"\nqos_ms = 60000.0\n'),
           "bert": ("config.json", '{"streams": 2, "max_queue": 32}')}


@pytest.fixture(scope="module")
def repository(tmp_path_factory, zoo):  # noqa: F811
    root = tmp_path_factory.mktemp("repository")
    for name, (config, text) in CONFIGS.items():
        (root / name).mkdir()
        (root / name / f"{name}.tvms").symlink_to(zoo[name][0])  # the shared artifact, read only
        (root / name / config).write_text(text)
    return root


@pytest.fixture(scope="module")
def direct(zoo):  # noqa: F811
    """Each model's outputs from a direct engine run of its inputs (the fastest candidates, as the policies read them:
    colocation's choice when nothing else runs)."""
    from tvmsched.runtime import Executor, policies
    from tvmsched.runtime.runtime import candidate_info

    out = {}
    for name, (path, inputs, _, _) in zoo.items():
        executor = Executor(path)
        layers = [[candidate_info(name, c, 1) for c in layer.candidates] for layer in executor.manifest.layers]
        out[name] = executor.run(inputs, policies.fastest_ids(layers))
    return out


@pytest.fixture(scope="module")
def serve_server(repository):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server([sys.executable, "-m", "tvmsched.cli", "serve", "--model-repository", str(repository),
                            "--policy", POLICY, "--port", str(port), "--grpc-port", "0"], base, ready="/v2/health/ready")
    yield base
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def cpp_server(cpp_build, repository):  # noqa: F811
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    process = start_server([str(cpp_build / "tvmsched_server"), "--model-repository", str(repository), "--policy", POLICY,
                            "--port", str(port)], base)
    yield base
    assert stop_server(process) == 0


@pytest.fixture(params=["serve", "cpp"])
def client(request):
    base = request.getfixturevalue(f"{request.param}_server")
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"), concurrency=4)
    yield client
    client.close()


def _inputs(zoo, name, binary=True):  # noqa: F811
    return _tensors(zoo[name][1], binary=binary)


def _same(result, want: dict) -> None:
    for key, array in want.items():
        np.testing.assert_array_equal(result.as_numpy(key), array)


def test_metadata_and_configuration_say_the_same_in_both(client, zoo):  # noqa: F811
    assert client.is_server_live() and client.is_server_ready()
    for name in CONFIGS:
        meta = client.get_model_metadata(name)
        assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == \
            [(k, "FP32", list(a.shape)) for k, a in zoo[name][1].items()]
    config = client.get_model_config("bert")
    assert config["max_batch_size"] == 0 and config["instance_group"][0]["count"] == 2
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["streams"] == "2" and params["policy"] == POLICY and params["max_queue"] == "32"
    assert params["priority"] == "best_effort" and params["placement"] == "resident"  # two streams: held, one copy
    mlp = {k: v["string_value"] for k, v in client.get_model_config("mlp")["parameters"].items()}
    assert float(mlp["qos_ms"]) == 60000.0 and mlp["streams"] == "1"


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_outputs_are_the_direct_runs_bits(client, zoo, direct, binary):  # noqa: F811
    for name in CONFIGS:
        _same(client.infer(name, _inputs(zoo, name, binary)), direct[name])


def test_priority_and_timeout_parameters_are_taken(client, zoo, direct):  # noqa: F811
    _same(client.infer("mlp", _inputs(zoo, "mlp"), priority=1), direct["mlp"])  # real-time for this request
    _same(client.infer("mlp", _inputs(zoo, "mlp"), priority=2, timeout=60_000_000), direct["mlp"])
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp", _inputs(zoo, "mlp"), parameters={"priority": "urgent"})
    assert "\n" not in str(err.value) and "priority" in str(err.value)


def test_a_model_on_two_streams_answers_concurrent_clients_and_the_statistics_count_them(client, zoo, direct):  # noqa: F811
    before = client.get_inference_statistics("bert")["model_stats"][0]["inference_count"]
    pending = [client.async_infer("bert", _inputs(zoo, "bert")) for _ in range(12)]
    for request in pending:
        _same(request.get_result(), direct["bert"])
    stats = client.get_inference_statistics("bert")["model_stats"][0]
    assert stats["inference_count"] == before + 12
    assert stats["inference_stats"]["success"]["count"] >= 12 and stats["inference_stats"]["queue"]["count"] >= 12


def test_unknown_models_and_wrong_shapes_are_one_error_line(client, zoo):  # noqa: F811
    with pytest.raises(InferenceServerException) as err:
        client.infer("nobody", _inputs(zoo, "mlp"))
    assert "\n" not in str(err.value) and "no model named 'nobody' is loaded (loaded: " in str(err.value)  # (the engine's line)
    tensor = tritonclient_http.InferInput("input", [1, 5], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 5), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp", [tensor])
    assert "\n" not in str(err.value) and "shape" in str(err.value)


def _keys(value) -> object:
    """The shape of a JSON value: its keys, nested (list items by their first)."""
    if isinstance(value, dict):
        return {k: _keys(v) for k, v in value.items()}
    return [_keys(value[0])] if isinstance(value, list) and value else type(value).__name__


def test_both_describe_and_count_a_model_alike(serve_server, cpp_server, zoo):  # noqa: F811
    """Metadata, Triton's model configuration, /v1/models and statistics are written by the engine for both servers
    (tvmsched/serving.h): the same JSON, and statistics of the same form that count an answered request alike."""
    import httpx

    for name in CONFIGS:
        for route in ("", "/config"):
            serve, cpp = (httpx.get(f"{base}/v2/models/{name}{route}", timeout=10).json()
                          for base in (serve_server, cpp_server))
            assert serve == cpp, route
    models = [httpx.get(f"{base}/v1/models", timeout=10).json() for base in (serve_server, cpp_server)]
    assert models[0] == models[1] and set(models[0]) == set(CONFIGS)  # examples/server.py's /v1 listing
    assert models[0]["mlp"] == {"qos_ms": 60000.0, "priority": "best_effort",
                                "inputs": {k: list(a.shape) for k, a in zoo["mlp"][1].items()}}
    counts, shapes, v1, texts_before = [], [], [], []
    for base in (serve_server, cpp_server):
        client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
        v1_before = httpx.get(f"{base}/v1/stats", timeout=10).json()
        texts_before.append(httpx.get(f"{base}/metrics", timeout=10).text)
        before = client.get_inference_statistics("mlp")["model_stats"][0]
        client.infer("mlp", _inputs(zoo, "mlp"))
        tensor = tritonclient_http.InferInput("input", [1, 5], "FP32")  # a wrong shape: refused, counted as failed
        tensor.set_data_from_numpy(np.zeros((1, 5), np.float32))
        with pytest.raises(InferenceServerException):
            client.infer("mlp", [tensor])
        after = client.get_inference_statistics("mlp")["model_stats"][0]
        client.close()
        v1_after = httpx.get(f"{base}/v1/stats", timeout=10).json()  # (the engine's Runtime stats, one writer)
        v1.append((sorted(v1_after), sorted(v1_after["mlp"]), sorted(v1_after["_scheduler"]),
                   {key: v1_after["mlp"][key] - v1_before["mlp"][key] for key in ("requests", "errors", "executions")}))
        counts.append({key: after["inference_stats"][key]["count"] - before["inference_stats"][key]["count"]
                       for key in ("success", "fail", "queue", "compute_infer")})
        counts[-1]["inference_count"] = after["inference_count"] - before["inference_count"]
        shapes.append(_keys(after))
    assert counts[0] == counts[1] == {"success": 1, "fail": 1, "queue": 1, "compute_infer": 1, "inference_count": 1}
    assert shapes[0] == shapes[1]
    assert v1[0] == v1[1] and v1[0][3] == {"requests": 1, "errors": 0, "executions": 1}  # (refused by the codec)
    # /metrics: the same families (the engine's writer; NVML's GPU gauges are Python's own), with the same samples for
    # what both counted alike: the requests and errors of mlp
    texts = [httpx.get(f"{base}/metrics", timeout=10).text for base in (serve_server, cpp_server)]
    families = [{line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ") and "nv_gpu" not in line}
                for text in texts]
    assert families[0] == families[1] and {"tvmsched_request_latency_seconds", "tvmsched_busy_streams",
                                           "tvmsched_launches_total", "nv_inference_count"} <= families[0]
    counted = [{line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(("tvmsched_requests_total{", "tvmsched_errors_total{"))} for text in texts + texts_before]
    deltas = [{key: counted[k][key] - counted[k + 2].get(key, 0) for key in counted[k]} for k in (0, 1)]
    assert deltas[0] == deltas[1] and deltas[0]['tvmsched_errors_total{model="mlp"}'] == 1
