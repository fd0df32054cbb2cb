"""build/cpp/tvmsched_server speaks the Open Inference Protocol (KServe v2) over REST (issue 31, C++ server parity).

Real processes on 127.0.0.1, real clients (tritonclient.http, binary tensors and JSON; httpx for hand-made bad
requests); outputs checked against onnxruntime. Skipped where the C++ toolchain or Debian's packages are missing,
as tests/test_cpp_examples.py is.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess

import httpx
import numpy as np
import pytest

from tests.helpers import ROOT, assert_user_error, free_port, start_server, stop_server
from tests.test_cpp_examples import cpp_build  # noqa: F401 (the fixture: `make cpp` once)
from tvmsched import models

tritonclient_http = pytest.importorskip("tritonclient.http")
InferenceServerException = pytest.importorskip("tritonclient.utils").InferenceServerException

MODELS = {"mlp": "mlp", "bert": "bert-tiny"}  # served name -> zoo model
NV_COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count",
               "nv_inference_exec_count", "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
               "nv_inference_compute_infer_duration_us")


@pytest.fixture(scope="module")
def zoo(compiled, reference):
    """Per served name: (artifact (shared, read only), inputs, onnxruntime's outputs, footprint when switched in)."""
    from tvmsched.runtime import Executor
    from tvmsched.runtime.switching import footprint

    out = {}
    for index, (name, zoo_name) in enumerate(MODELS.items()):
        model = models.build(zoo_name)
        path = compiled(model, name=zoo_name)
        inputs = models.random_inputs(model, seed=index)
        out[name] = (path, inputs, reference(model, inputs), footprint(Executor(path, register_groups=8)))
    return out


def _start(build, zoo, *flags: str, names=tuple(MODELS)) -> tuple[subprocess.Popen, str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [str(build / "tvmsched_server"), "--port", str(port), *flags]
    for name in names:
        command += ["--model", f"{name}={zoo[name][0]}"]
    return start_server(command, base), base


@pytest.fixture(scope="module")
def server(cpp_build, zoo):  # noqa: F811
    """The server with both models resident: (base URL, tritonclient)."""
    proc, base = _start(cpp_build, zoo)
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"), concurrency=4)
    try:
        yield base, client
        assert proc.poll() is None
    finally:
        client.close()
        assert stop_server(proc) == 0


def _infer(client, name: str, inputs: dict, *, binary: bool, outputs: bool = True, request_id: str = ""):
    """tritonclient's infer: binary tensors both ways, or JSON both ways; `outputs=False` asks for none (all come, as
    binary: tritonclient then sets binary_data_output)."""
    tensors = _tensors(inputs, binary=binary)
    requested = None
    if outputs:
        requested = [tritonclient_http.InferRequestedOutput(key, binary_data=binary) for key in _output_names(name)]
    return client.infer(name, tensors, outputs=requested, request_id=request_id)


def _output_names(name: str) -> list[str]:
    return ["output"]  # both zoo models have one output named "output"


def _tensors(inputs: dict, *, binary: bool = True) -> list:
    """tritonclient's InferInputs of FP32 arrays keyed by input name (binary tensor data, or JSON)."""
    tensors = []
    for key, value in inputs.items():
        tensor = tritonclient_http.InferInput(key, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        tensors.append(tensor)
    return tensors


def _check(result, expected: dict) -> None:
    for key, value in expected.items():
        got = result.as_numpy(key)
        assert got.dtype == value.dtype and got.shape == value.shape, (key, got.dtype, got.shape)
        np.testing.assert_allclose(got, value, rtol=1e-4, atol=1e-4)


def test_metadata_config_and_health(server, zoo):
    base, client = server
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "tvmsched" and meta["version"] != "unknown"
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(meta["extensions"])
    for name, (_, inputs, expected, _) in zoo.items():
        want_in = [{"name": k, "datatype": "FP32", "shape": list(v.shape)} for k, v in inputs.items()]
        want_out = [{"name": k, "datatype": "FP32", "shape": list(v.shape)} for k, v in expected.items()]
        for version in ("", "1"):
            assert client.is_model_ready(name, version)
            model = client.get_model_metadata(name, version)
            assert (model["name"], model["platform"], model["versions"]) == (name, "tvmsched", ["1"])
            assert model["inputs"] == want_in and model["outputs"] == want_out
            config = client.get_model_config(name, version)
            assert config["name"] == name and config["platform"] == "tvmsched" and config["max_batch_size"] == 0
            assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == \
                [(t["name"], "TYPE_FP32", t["shape"]) for t in want_in]
            assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == \
                [(t["name"], "TYPE_FP32", t["shape"]) for t in want_out]
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "2")
    for call in (lambda: client.get_model_metadata("nope"), lambda: client.get_model_config("mlp", "2"),
                 lambda: client.get_inference_statistics("nope")):
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == "404", err.value
    reply = httpx.get(f"{base}/v2/models/mlp/versions/7", timeout=10)
    assert reply.status_code == 404 and reply.json() == {"error": "model 'mlp' has no version '7' (it has version 1)"}
    assert httpx.get(f"{base}/v2/nothing/here", timeout=10).json() == {"error": "Not Found"}
    assert set(client.get_inference_statistics()["model_stats"][i]["name"] for i in range(2)) == set(MODELS)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_outputs_match_onnxruntime(server, zoo, binary):
    _, client = server
    for name, (_, inputs, expected, _) in zoo.items():
        result = _infer(client, name, inputs, binary=binary, request_id=f"req-{name}")
        _check(result, expected)
        response = result.get_response()
        assert response["id"] == f"req-{name}" and response["model_name"] == name and response["model_version"] == "1"
        for out in response["outputs"]:  # binary outputs are announced by size, JSON ones hold flat row-major data
            nbytes = expected[out["name"]].nbytes
            assert (out.get("parameters", {}).get("binary_data_size"), "data" in out) == \
                ((nbytes, False) if binary else (None, True))
            if not binary:
                assert len(out["data"]) == expected[out["name"]].size
    # no outputs named: all of them, as binary (tritonclient sets binary_data_output); JSON inputs then
    _check(_infer(client, "mlp", zoo["mlp"][1], binary=False, outputs=False), zoo["mlp"][2])


def test_binary_mix_and_raw_protocol(server, zoo):
    """By hand: one input as binary data after the JSON header, a JSON request with nested data (Triton accepts it),
    and the answer's binary layout (Inference-Header-Content-Length, then the output's bytes)."""
    base, _ = server
    _, inputs, expected, _ = zoo["mlp"]
    x = inputs["input"]
    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
    reply = httpx.post(f"{base}/v2/models/mlp/infer", content=header + x.tobytes(),
                       headers={"Inference-Header-Content-Length": str(len(header))}, timeout=60)
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    head = json.loads(reply.content[:length])
    assert head["outputs"][0]["parameters"]["binary_data_size"] == expected["output"].nbytes == len(reply.content) - length
    got = np.frombuffer(reply.content[length:], np.float32).reshape(head["outputs"][0]["shape"])
    np.testing.assert_allclose(got, expected["output"], rtol=1e-4, atol=1e-4)

    nested = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.tolist()}]}
    reply = httpx.post(f"{base}/v2/models/mlp/versions/1/infer", json=nested, timeout=60)
    assert reply.status_code == 200 and "Inference-Header-Content-Length" not in reply.headers
    out = reply.json()["outputs"][0]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), expected["output"], rtol=1e-4,
                               atol=1e-4)
    # /v1 is served as before
    reply = httpx.post(f"{base}/v1/models/mlp/infer", json={"inputs": {"input": x.tolist()}}, timeout=60)
    assert reply.status_code == 200
    np.testing.assert_allclose(np.array(reply.json()["outputs"]["output"], np.float32), expected["output"], rtol=1e-4,
                               atol=1e-4)


def _bad_requests(x: np.ndarray):
    """(path, body, headers, status, fragment of the error) for requests the server must refuse."""
    ok = {"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}
    body = lambda *inputs, **extra: json.dumps({"inputs": list(inputs), **extra}).encode()
    binary = lambda size, data: (json.dumps({"inputs": [{**{k: v for k, v in ok.items() if k != "data"},
                                                         "parameters": {"binary_data_size": size}}]}).encode(), data)
    header, _ = binary(x.nbytes, b"")
    mlp = "/v2/models/mlp/infer"
    yield mlp, body({**ok, "datatype": "INT32"}), {}, 400, "has datatype 'INT32' but model 'mlp' expects FP32"
    yield mlp, body({**ok, "datatype": "FLOAT"}), {}, 400, "has datatype 'FLOAT'"
    yield mlp, body({**ok, "shape": [2, 784]}), {}, 400, "has shape [2,784] but model 'mlp' expects [1,784]"
    yield mlp, body({**ok, "shape": [784]}), {}, 400, "has shape [784]"
    yield mlp, body({**ok, "data": ok["data"][:-1]}), {}, 400, "has 783 elements in 'data'; its shape [1,784] needs 784"
    yield mlp, body({**ok, "data": ok["data"] + [1.0]}), {}, 400, "has 785 elements"
    yield mlp, body({**ok, "data": ["a"] * 784}), {}, 400, "holds \"a\", which is not a FP32 value"
    yield mlp, body({**ok, "name": "nope"}), {}, 400, "model 'mlp' has no input named 'nope' (its inputs: 'input')"
    yield mlp, body(ok, ok), {}, 400, "input 'input' is given twice"
    yield mlp, body(), {}, 400, "needs input 'input'"
    yield mlp, body(ok, outputs=[{"name": "nope"}]), {}, 400, "has no output named 'nope'"
    yield mlp, body({k: v for k, v in ok.items() if k != "data"}), {}, 400, "has neither 'data' nor"
    yield mlp, b"{\"inputs\": [", {}, 400, "not valid JSON"
    yield mlp, b"[1]", {}, 400, "must be a JSON object"
    yield mlp, b"{\"inputs\": " + b"[" * 100000 + b"]" * 100000 + b"}", {}, 400, "nests deeper than 64 levels"
    yield mlp, body(ok, parameters={"binary_data_output": "yes"}), {}, 400, "'binary_data_output' must be true or false"
    # the binary tensor extension: sizes against the shape, and against the bytes that follow the JSON header
    for size, data, fragment in ((x.nbytes - 4, x.tobytes()[:-4], "has binary_data_size 3132 but its shape [1,784] of "
                                  "FP32 needs 3136 bytes"),
                                 (x.nbytes, x.tobytes()[:-4], "only 3132 bytes of binary data are left for it"),
                                 (x.nbytes, x.tobytes() + b"\0" * 8, "has 3144 bytes after its JSON header but its "
                                  "inputs' binary_data_size add up to 3136")):
        head, tail = binary(size, data)
        yield mlp, head + tail, {"Inference-Header-Content-Length": str(len(head))}, 400, fragment
    for value in ("abc", "0", str(len(header) + x.nbytes + 1), "-5"):
        yield mlp, header + x.tobytes(), {"Inference-Header-Content-Length": value}, 400, \
            f"Inference-Header-Content-Length is '{value}'"
    yield mlp, header + x.tobytes(), {}, 400, "not valid JSON"  # binary bytes without the header's length
    yield "/v2/models/none/infer", body(ok), {}, 404, "no model named 'none'"
    yield "/v2/models/mlp/versions/2/infer", body(ok), {}, 404, "model 'mlp' has no version '2'"


def test_bad_requests_get_one_error_line(server, zoo):
    base, client = server
    x = zoo["mlp"][1]["input"]
    for path, body, headers, status, fragment in _bad_requests(x):
        reply = httpx.post(base + path, content=body, headers={"content-type": "application/json", **headers},
                           timeout=60)
        assert reply.status_code == status, (fragment, reply.status_code, reply.text)
        error = reply.json()
        assert list(error) == ["error"] and "\n" not in error["error"], error
        assert fragment in error["error"], (fragment, error)
    big = httpx.post(f"{base}/v2/models/mlp/infer", content=b" " * (16 << 20 | 1), timeout=60)  # --max-body-bytes
    assert big.status_code == 413 and big.json() == {"error": "Payload Too Large"}
    # through tritonclient: its InferenceServerException carries the status and the line
    tensor = tritonclient_http.InferInput("input", [2, 784], "FP32")
    tensor.set_data_from_numpy(np.zeros((2, 784), np.float32))
    with pytest.raises(InferenceServerException) as err:
        client.infer("mlp", [tensor])
    assert err.value.status() == "400" and "has shape [2,784]" in err.value.message()
    _check(_infer(client, "mlp", zoo["mlp"][1], binary=True), zoo["mlp"][2])  # and it still serves


def _sample(text: str, name: str, **labels: str) -> float:
    """The value of the series `name` with exactly `labels` in Prometheus text, by its exact name (prometheus_client's
    parser would rename a counter's samples to NAME_total: Triton's names have no _total)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)", line)
        if match and match[1] == name and ",".join(sorted((match[2] or "").split(","))) == want:
            return float(match[3])
    raise KeyError(f"{name}{labels} not in:\n{text}")


def _metrics(base: str) -> str:
    reply = httpx.get(f"{base}/metrics", timeout=10)
    assert reply.status_code == 200
    return reply.text


def test_metrics_and_statistics_count_requests(server, zoo):
    base, client = server
    before = _metrics(base)
    stats_before = client.get_inference_statistics("mlp")["model_stats"][0]
    n = 5
    for i in range(n):
        _check(_infer(client, "mlp", zoo["mlp"][1], binary=bool(i % 2)), zoo["mlp"][2])
    for _ in range(2):  # failures: a wrong shape and a wrong datatype
        for body in ({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]},
                     {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 784], "data": [0] * 784}]}):
            assert httpx.post(f"{base}/v2/models/mlp/infer", json=body, timeout=60).status_code == 400
    after = _metrics(base)
    delta = lambda text, metric, model: _sample(text, metric, model=model, version="1")
    grew = {m: delta(after, m, "mlp") - delta(before, m, "mlp") for m in NV_COUNTERS}
    assert grew["nv_inference_request_success"] == n and grew["nv_inference_request_failure"] == 4
    assert grew["nv_inference_count"] == n and grew["nv_inference_exec_count"] == n
    for duration in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                     "nv_inference_compute_infer_duration_us"):
        assert grew[duration] > 0, duration
    # the request's duration holds its queueing and computing
    assert grew["nv_inference_request_duration_us"] >= \
        grew["nv_inference_queue_duration_us"] + grew["nv_inference_compute_infer_duration_us"]
    assert _sample(after, "nv_inference_pending_request_count", model="mlp", version="1") == 0
    for metric in NV_COUNTERS:  # bert's series are its own
        assert delta(after, metric, "bert") == delta(before, metric, "bert"), metric
    # the tvmsched series count the /v2 requests too
    assert _sample(after, "tvmsched_requests_total", model="mlp") - _sample(before, "tvmsched_requests_total", model="mlp") == n + 4
    assert _sample(after, "tvmsched_errors_total", model="mlp") - _sample(before, "tvmsched_errors_total", model="mlp") == 4

    stats = client.get_inference_statistics("mlp", "1")["model_stats"][0]
    assert (stats["name"], stats["version"]) == ("mlp", "1")
    got = lambda s, key: s["inference_stats"][key]["count"]
    assert got(stats, "success") - got(stats_before, "success") == n
    assert got(stats, "fail") - got(stats_before, "fail") == 4
    assert stats["inference_count"] - stats_before["inference_count"] == n
    assert stats["execution_count"] - stats_before["execution_count"] == n
    assert stats["last_inference"] > 0 and stats["inference_stats"]["compute_infer"]["ns"] > 0


def _send(base: str, name: str, inputs: dict) -> http.client.HTTPConnection:
    """Write one binary inference request (tritonclient's body) on a new connection; the answer is left unread."""
    tensors = []
    for key, value in inputs.items():
        tensor = tritonclient_http.InferInput(key, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    body, json_size = tritonclient_http.InferenceServerClient.generate_request_body(tensors)
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", f"/v2/models/{name}/infer", body=body,
                       headers={"Inference-Header-Content-Length": str(json_size)})
    return connection


def _burst(base: str, requests: list) -> tuple[int, int]:
    """Write every (model, inputs, expected outputs) request on its own connection, then read the answers: each is
    right (decoded by tritonclient) or a 503 naming --max-queue. Returns (answered, refused)."""
    connections = [_send(base, name, inputs) for name, inputs, _ in requests]
    answered = refused = 0
    for connection, (_, _, expected) in zip(connections, requests):
        reply = connection.getresponse()
        data = reply.read()
        connection.close()
        if reply.status == 503:
            error = json.loads(data)
            assert list(error) == ["error"] and "--max-queue" in error["error"], data
            refused += 1
        else:
            assert reply.status == 200, data
            length = int(reply.getheader("Inference-Header-Content-Length"))
            _check(tritonclient_http.InferResult.from_response_body(data, header_length=length), expected)
            answered += 1
    return answered, refused


def test_queue_limit_answers_503(cpp_build, zoo):  # noqa: F811
    """--max-queue 1: of requests that arrive together, those finding one queued or running get 503; the rest are
    answered right. Each burst writes 8 whole requests on 8 connections before reading any answer (tritonclient's
    async_infer sends them slower than bert-tiny answers here)."""
    proc, base = _start(cpp_build, zoo, "--max-queue", "1", names=("bert",))
    _, inputs, expected, _ = zoo["bert"]
    try:
        answered = refused = 0
        for _ in range(10):  # until a burst overlaps (on a loaded machine one may trickle in)
            done, busy = _burst(base, [("bert", inputs, expected)] * 8)
            answered, refused = answered + done, refused + busy
            if refused and answered:
                break
        assert refused and answered, (refused, answered)
        metrics = _metrics(base)
        assert _sample(metrics, "nv_inference_request_failure", model="bert", version="1") == refused
        assert _sample(metrics, "nv_inference_request_success", model="bert", version="1") == answered
        assert _sample(metrics, "nv_inference_pending_request_count", model="bert", version="1") == 0
    finally:
        assert stop_server(proc) == 0


def test_switching_under_a_memory_budget(cpp_build, zoo):  # noqa: F811
    """--memory-budget below what the models hold together (mlp and two tenants of bert-tiny; a model's footprint
    overestimates what it holds, so two models alone would fit): the Runtime switches each in by its requests (others
    evicted), answers stay right, and the models' memory never passes the budget. Requests go one at a time: at
    the same time, the engine's switcher fails some of them (docs/cpp-server.md, "Known issue"; Python's Runtime too)."""
    sizes = {name: entry[3] for name, entry in zoo.items()}
    budget = max(sizes.values()) + 4096  # what Runtime(memory_budget=...) needs to take the largest one
    served = {**zoo, "bert2": zoo["bert"]}
    proc, base = _start(cpp_build, served, "--memory-budget", str(budget), names=("mlp", "bert", "bert2"))
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"), concurrency=4)
    try:
        sequence = ["bert", "mlp", "bert2", "bert", "mlp", "bert2", "bert2", "bert"] + ["mlp", "bert", "bert2"] * 4
        for i, name in enumerate(sequence):
            _check(_infer(client, name, served[name][1], binary=bool(i % 2)), served[name][2])
        memory = httpx.get(f"{base}/v1/stats", timeout=10).json()["_memory"]
        assert memory["budget"] == budget and memory["peak"] <= budget and memory["in_use"] <= budget, memory
        assert memory["footprints"] == {**sizes, "bert2": sizes["bert"]}  # the engine's sizes are the Python runtime's
        assert len(memory["resident"]) < 3, memory
        placements = {client.get_model_config(name)["parameters"]["placement"]["string_value"] for name in served}
        assert placements == {"staged"}
        metrics = _metrics(base)
        for name in served:
            assert _sample(metrics, "nv_inference_request_success", model=name, version="1") == sequence.count(name)
        assert _sample(metrics, "nv_inference_request_failure", model="bert2", version="1") == 0
    finally:
        client.close()
        assert stop_server(proc) == 0
    # a model larger than the whole budget streams its weights from host memory (the Runtime's placement, as in
    # tvmsched serve), and answers right
    proc, base = _start(cpp_build, zoo, "--memory-budget", str(sizes["bert"] - 1), names=("bert",))
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
    try:
        assert client.get_model_config("bert")["parameters"]["placement"]["string_value"] == "streamed"
        _check(_infer(client, "bert", zoo["bert"][1], binary=True), zoo["bert"][2])
    finally:
        client.close()
        assert stop_server(proc) == 0
    # one that cannot even stream through the budget, and bad values, stop the server at once with one line
    run = lambda *flags: subprocess.run([str(cpp_build / "tvmsched_server"), "--port", str(free_port()), *flags,
                                         "--model", f"bert={zoo['bert'][0]}"], cwd=ROOT, capture_output=True,
                                        text=True, timeout=120)
    assert_user_error(run("--memory-budget", "1.5KiB"), "larger than the runtime's memory budget of 1536 bytes")
    assert_user_error(run("--memory-budget", "lots"), "--memory-budget must be a number of bytes, optionally with a "
                      "unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB), of at least 1 byte, not 'lots'")
    assert_user_error(run("--max-queue", "-1"), "--max-queue must be an integer of at least 0")


def test_real_time_requests_preempt_best_effort_ones_through_the_engine(cpp_build, zoo):  # noqa: F811
    """mlp real-time, bert best-effort: real-time requests preempt bert's busy stream (the engine's preemption group,
    counted in tvmsched_preemptions_total) and bert resumes after them; every answer of both is right."""
    import threading

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server([str(cpp_build / "tvmsched_server"), "--port", str(port), "--model", f"mlp={zoo['mlp'][0]}:1000:realtime",
                         "--model", f"bert={zoo['bert'][0]}:1000:best_effort"], base)
    stop, answers, failures = threading.Event(), [], []

    def best_effort_client():
        client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
        try:
            while not stop.is_set():
                answers.append(_infer(client, "bert", zoo["bert"][1], binary=True))
        except Exception as err:  # noqa: BLE001 (reported below)
            failures.append(err)
        finally:
            client.close()

    clients = [threading.Thread(target=best_effort_client) for _ in range(4)]
    try:
        for thread in clients:
            thread.start()
        realtime = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
        preempted = 0.0
        for _ in range(300):
            _check(_infer(realtime, "mlp", zoo["mlp"][1], binary=True), zoo["mlp"][2])
            preempted = _sample(httpx.get(f"{base}/metrics", timeout=10).text, "tvmsched_preemptions_total", model="bert")
            if preempted >= 3:
                break
        realtime.close()
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
        assert not failures, failures
        assert preempted >= 3, "bert was never busy when a real-time request came"
        metrics = httpx.get(f"{base}/metrics", timeout=10).text
        assert _sample(metrics, "tvmsched_preemptions_total", model="mlp") == 0
        assert answers
        for result in answers:  # preempted and resumed: still right
            _check(result, zoo["bert"][2])
    finally:
        stop.set()
        assert stop_server(proc) == 0


def test_runtime_streams_policy_priority_and_timeout(cpp_build, zoo, tmp_path):  # noqa: F811
    """The server is an adapter over the engine's Runtime: a model repository (tvmsched serve's layout and keys, JSON
    and TOML) serves bert on 2 streams that both take requests; --policy reaches the Runtime; a request's
    parameters.priority 1 preempts the busy best-effort streams of another model; parameters.timeout (µs) that runs
    out while the request is queued answers 504, as tvmsched serve; bad parameters are 400 lines."""
    import threading

    for name, config, text in (("bert", "config.json", '{"streams": 2, "max_queue": 32, "qos_ms": 60000}'),
                               ("mlp", "config.toml", 'priority = "best_effort"  # TOML\nwarmup = false\n')):
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.tvms").symlink_to(zoo[name][0])  # the shared artifact, read only
        (tmp_path / name / config).write_text(text)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server([str(cpp_build / "tvmsched_server"), "--port", str(port), "--model-repository", str(tmp_path),
                         "--policy", "fastest"], base)
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"), concurrency=8)
    stop, failures = threading.Event(), []
    try:
        config = client.get_model_config("bert")
        assert config["instance_group"][0]["count"] == 2 and config["parameters"]["streams"]["string_value"] == "2"
        assert config["parameters"]["policy"]["string_value"] == "fastest"
        assert config["parameters"]["max_queue"]["string_value"] == "32"
        stats = lambda: httpx.get(f"{base}/v1/stats", timeout=10).json()
        assert stats()["_scheduler"]["policy"] == "fastest"
        before = stats()["bert"]["stream_requests"]
        pending = [client.async_infer("bert", _bert_tensor(zoo)) for _ in range(24)]  # 8 at a time: both streams
        for request in pending:
            _check(request.get_result(), zoo["bert"][2])
        after = stats()["bert"]["stream_requests"]
        assert len(after) == 2 and all(a > b for a, b in zip(after, before)), (before, after)

        def best_effort_load():
            own = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
            try:
                while not stop.is_set():
                    _infer(own, "bert", zoo["bert"][1], binary=True)
            except Exception as err:  # noqa: BLE001 (reported below)
                failures.append(err)
            finally:
                own.close()

        threads = [threading.Thread(target=best_effort_load) for _ in range(4)]
        for thread in threads:
            thread.start()
        tensor = tritonclient_http.InferInput("input", list(zoo["mlp"][1]["input"].shape), "FP32")
        tensor.set_data_from_numpy(zoo["mlp"][1]["input"])
        preempted = 0.0
        for _ in range(300):  # mlp is best-effort: its requests preempt bert only because they ask for priority 1
            _check(client.infer("mlp", [tensor], priority=1), zoo["mlp"][2])
            preempted = _sample(_metrics(base), "tvmsched_preemptions_total", model="bert")
            if preempted >= 3:
                break
        assert preempted >= 3, "bert was never preempted by a real-time request"
        timed_out = 0
        for _ in range(20):  # bert's streams are busy: a request that may wait 1 µs in the queue cannot start
            try:
                client.infer("bert", _bert_tensor(zoo), timeout=1)
            except InferenceServerException as err:
                assert err.status() == "504", err
                timed_out += 1
        assert timed_out, "no request timed out in the queue"
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures
        assert stats()["bert"]["timed_out"] >= timed_out
        _check(client.infer("bert", _bert_tensor(zoo), timeout=60_000_000), zoo["bert"][2])  # time enough
        for parameters, fragment in (({"priority": "high"}, "parameter priority must be"),
                                     ({"timeout": -5}, "parameter timeout must be a whole number"),
                                     ({"timeout": 1.5}, "parameter timeout must be")):
            body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                                "data": zoo["mlp"][1]["input"].ravel().tolist()}], "parameters": parameters}
            reply = httpx.post(f"{base}/v2/models/mlp/infer", json=body, timeout=60)
            assert reply.status_code == 400 and fragment in reply.json()["error"], reply.text
    finally:
        stop.set()
        client.close()
        assert stop_server(proc) == 0
    bad = subprocess.run([str(cpp_build / "tvmsched_server"), "--port", str(free_port()), "--policy", "nope",
                          "--model", f"mlp={zoo['mlp'][0]}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_user_error(bad, "nope")
    (tmp_path / "mlp" / "config.toml").write_text("streams = 0\n")
    bad = subprocess.run([str(cpp_build / "tvmsched_server"), "--port", str(free_port()), "--model-repository",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_user_error(bad, "config.toml: streams must be from 1 to 64")


def _bert_tensor(zoo) -> list:
    return _tensors(zoo["bert"][1])
