"""`tvmsched serve` over HTTP: tritonclient.http (binary and JSON) and plain requests against a real server on
127.0.0.1 serving a model repository (mlp, bert-tiny as "bert" with max_queue 2)."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.helpers import assert_user_error, free_port, run_cli
from tests.serve import kserve_server
from tests.serve.kserve_server import bert_input, mlp_input


@pytest.fixture(scope="module")
def server(tmp_path_factory, compiled, reference):
    served = kserve_server.start(tmp_path_factory.mktemp("kserve_http"), compiled=compiled, reference=reference)
    yield served
    kserve_server.stop(served)


@pytest.fixture()
def client(server):
    client = triton.InferenceServerClient(server.http, concurrency=4)
    yield client
    client.close()


def infer(client, model, name, array, binary):
    tensor = triton.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array, binary_data=binary)
    return client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("output", binary_data=binary)],
                        request_id=f"req-{binary}")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_outputs_equal_onnxruntime(server, client, binary):
    for model, name, array in (("mlp", "input", mlp_input(1)), ("bert", "hidden_states", bert_input(1))):
        result = infer(client, model, name, array, binary)
        want = server.reference(model, {name: array})["output"]
        np.testing.assert_allclose(result.as_numpy("output"), want, rtol=1e-3, atol=1e-4)
        assert result.get_response()["id"] == f"req-{binary}"
        assert result.get_response()["model_name"] == model


def test_plain_json_and_binary_bodies(server):
    x = mlp_input(2)
    want = server.reference("mlp", {"input": x})["output"]
    body = {"id": "curl", "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": x.ravel().tolist()}]}
    reply = httpx.post(f"http://{server.http}/v2/models/mlp/versions/1/infer", json=body, timeout=60)
    assert reply.status_code == 200 and reply.headers["content-type"] == "application/json"
    out = reply.json()["outputs"][0]
    assert out["datatype"] == "FP32" and out["shape"] == [1, 10] and reply.json()["id"] == "curl"
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(1, 10), want, rtol=1e-4, atol=1e-5)
    # binary input and output by hand: the header length in Inference-Header-Content-Length both ways
    header = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784],
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    reply = httpx.post(f"http://{server.http}/v2/models/mlp/infer", content=header + x.tobytes(), timeout=60,
                       headers={"Inference-Header-Content-Length": str(len(header))})
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    meta = json.loads(reply.content[:length])
    assert meta["outputs"][0]["parameters"]["binary_data_size"] == 40
    np.testing.assert_allclose(np.frombuffer(reply.content[length:], np.float32).reshape(1, 10), want, rtol=1e-4, atol=1e-5)
    # examples/server.py's contract still answers
    reply = httpx.post(f"http://{server.http}/v1/models/mlp/infer", json={"inputs": {"input": x.tolist()}}, timeout=60)
    np.testing.assert_allclose(np.array(reply.json()["outputs"]["output"], np.float32), want, rtol=1e-4, atol=1e-5)


def test_the_serving_process_never_loads_torch_or_grpcio_tools(server, client):
    """Serving needs neither (issue 37): the serving process, its HTTP and gRPC services up, has not mapped their
    libraries (torch is installed here, and TVM's own packages would import it)."""
    assert client.is_server_ready()
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "libtvmsched_engine" in maps  # the check reads the right process
    assert "libtorch" not in maps and "grpc_tools" not in maps


def test_health_metadata_config_and_statistics(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and not client.is_model_ready("nope")
    meta = client.get_server_metadata()
    assert {"binary_tensor_data", "model_repository", "statistics"} <= set(meta["extensions"])
    assert client.get_model_metadata("bert") == {
        "name": "bert", "versions": ["1"], "platform": "tvmsched",
        "inputs": [{"name": "hidden_states", "datatype": "FP32", "shape": [1, 128, 128]}],
        "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 128, 128]}]}
    config = client.get_model_config("mlp")
    assert config["max_batch_size"] == 0 and config["backend"] == "tvmsched"
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": [1, 784]}]
    assert config["output"] == [{"name": "output", "data_type": "TYPE_FP32", "dims": [1, 10]}]
    before = client.get_inference_statistics("mlp")["model_stats"][0]
    for seed in range(3):
        infer(client, "mlp", "input", mlp_input(seed), True)
    after = client.get_inference_statistics("mlp")["model_stats"][0]
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    stats = after["inference_stats"]
    assert stats["success"]["count"] - before["inference_stats"]["success"]["count"] == 3
    assert stats["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    assert stats["success"]["ns"] > stats["compute_infer"]["ns"]  # the request's whole time holds its compute


BAD = [  # (model, JSON body or (header, binary), status, fragment of the error)
    ("mlp", {"inputs": [{"name": "input", "datatype": "INT64", "shape": [1, 784], "data": [0] * 784}]}, 400, "has datatype 'INT64' but model 'mlp' expects FP32"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 783], "data": [0] * 783}]}, 400, "has shape [1,783] but model 'mlp' expects [1,784]"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0] * 10}]}, 400, "has 10 elements in 'data'; its shape [1,784] needs 784"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": ["x"] * 784}]}, 400, "holds \"x\", which is not a FP32 value"),
    ("mlp", {"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1, 784], "data": [0] * 784}]}, 400, "has no input named 'nope' (its inputs: 'input')"),
    ("mlp", {"inputs": []}, 400, "needs input 'input', which the request does not give"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0] * 784}],
             "outputs": [{"name": "logits"}]}, 400, "has no output named 'logits'"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0] * 784}],
             "parameters": {"priority": "urgent"}}, 400, "parameter priority"),
    ("mlp", {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": [0] * 784}],
             "parameters": {"timeout": -5}}, 400, "parameter timeout"),
    ("mlp", (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], '
             b'"parameters": {"binary_data_size": 3136}}]}', b"\0" * 3000), 400, "only 3000 bytes of binary data are left for it"),
    ("mlp", (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], '
             b'"parameters": {"binary_data_size": 3000}}]}', b"\0" * 3000), 400, "binary_data_size 3000 but its shape [1,784] of FP32 needs 3136 bytes"),
    ("mlp", (b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], '
             b'"parameters": {"binary_data_size": 3136}}]}', b"\0" * 3200), 400, "add up to 3136"),
    ("mlp", b"{not json", 400, "not valid JSON"),
    ("nope", {"inputs": []}, 404, "no model named 'nope' is loaded"),
    ("mlp/versions/7", {"inputs": []}, 404, "no version '7'"),
]


@pytest.mark.parametrize("model,body,status,fragment", BAD, ids=[f"{i}-{b[3][:20]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_one_error_line(server, model, body, status, fragment):
    url = f"http://{server.http}/v2/models/{model}/infer"
    if isinstance(body, dict):
        reply = httpx.post(url, json=body, timeout=60)
    elif isinstance(body, tuple):
        reply = httpx.post(url, content=body[0] + body[1], timeout=60,
                           headers={"Inference-Header-Content-Length": str(len(body[0]))})
    else:
        reply = httpx.post(url, content=body, timeout=60)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert fragment in error and "\n" not in error and "Traceback" not in error, error
    # and the model still serves
    assert httpx.get(f"http://{server.http}/v2/models/mlp/ready", timeout=10).status_code == 200


def test_tritonclient_sees_the_error(client):
    tensor = triton.InferInput("input", [1, 784], "FP32")
    tensor.set_data_from_numpy(mlp_input(0)[:, :784])
    with pytest.raises(InferenceServerException, match="no model named 'resnet' is loaded") as err:
        client.infer("resnet", [tensor])
    assert err.value.status() == "404"


def test_unload_and_load_while_another_model_serves(server, client):
    x = mlp_input(3)
    want = server.reference("mlp", {"input": x})["output"]
    stop, results = threading.Event(), []

    def hammer():
        with triton.InferenceServerClient(server.http) as own:
            while not stop.is_set():
                results.append(infer(own, "mlp", "input", x, True).as_numpy("output"))

    worker = threading.Thread(target=hammer)
    worker.start()
    try:
        client.unload_model("bert")
        index = {row["name"]: row for row in client.get_model_repository_index()}
        assert index["bert"]["state"] == "UNAVAILABLE" and index["mlp"]["state"] == "READY"
        assert not client.is_model_ready("bert")
        with pytest.raises(InferenceServerException, match="no model named 'bert' is loaded"):
            infer(client, "bert", "hidden_states", bert_input(0), True)
        client.load_model("bert")
        assert client.is_model_ready("bert")
        h = bert_input(4)
        np.testing.assert_allclose(infer(client, "bert", "hidden_states", h, True).as_numpy("output"),
                                   server.reference("bert", {"hidden_states": h})["output"], rtol=1e-3, atol=1e-4)
        with pytest.raises(InferenceServerException, match="no model named 'resnet' in the repository"):
            client.load_model("resnet")
    finally:
        stop.set()
        worker.join(timeout=60)
    assert results and all(np.allclose(r, want, rtol=1e-4, atol=1e-5) for r in results)


def test_a_load_that_overrides_the_config_or_files_is_refused_and_the_model_keeps_serving(server, client):
    """Triton's load parameters `config` and `file:PATH` replace the model's folder for that load; tvmsched reads the
    folder only, so each is refused with one line (never loaded from the folder as if it had been applied)."""
    with pytest.raises(InferenceServerException, match="load parameter 'config' is not supported"):
        client.load_model("mlp", config=json.dumps({"max_batch_size": 2}))
    url = f"http://{server.http}/v2/repository/models/mlp/load"
    for body, status, line in [
        (b'{"parameters": {"file:1/model.tvms": "YWJj"}}', 400, "load parameter 'file:1/model.tvms' is not supported"),
        (b'{"parameters": ', 400, "the load request's body is not JSON"),
        (b'{"parameters": [1]}', 400, 'its "parameters" an object'),
    ]:
        answer = httpx.post(url, content=body, timeout=60)
        assert answer.status_code == status and line in answer.json()["error"], answer.text
    assert client.is_model_ready("mlp")
    x = mlp_input(2)
    np.testing.assert_allclose(infer(client, "mlp", "input", x, True).as_numpy("output"),
                               server.reference("mlp", {"input": x})["output"], rtol=1e-4, atol=1e-5)


def _post_many(server, model, body, count):
    url = f"http://{server.http}/v2/models/{model}/infer"
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: httpx.post(url, json=body, timeout=120), range(count)))


def test_queue_cap_answers_503_and_every_request_is_answered(server):
    h = bert_input(5)
    body = {"inputs": [{"name": "hidden_states", "datatype": "FP32", "shape": [1, 128, 128], "data": h.ravel().tolist()}]}
    want = server.reference("bert", {"hidden_states": h})["output"]
    # bert's max_queue is 2: of 16 at once, those arriving while two are admitted are refused. How many overlap
    # depends on the machine (see the next test), the answers do not
    replies = _post_many(server, "bert", body, 16)
    codes = [r.status_code for r in replies]
    assert set(codes) <= {200, 503} and 200 in codes, codes
    for reply in replies:
        if reply.status_code == 503:
            assert "max_queue 2" in reply.json()["error"]
        else:
            np.testing.assert_allclose(np.array(reply.json()["outputs"][0]["data"], np.float32).reshape(want.shape), want,
                                       rtol=1e-3, atol=1e-4)


def test_a_request_that_cannot_start_in_time_is_refused_never_run_late(server):
    h = bert_input(6)
    body = lambda timeout, **more: {"inputs": [{"name": "hidden_states", "datatype": "FP32", "shape": [1, 128, 128],
                                                "data": h.ravel().tolist()}], "parameters": {"timeout": timeout, **more}}
    # 1 µs: even with nothing ahead it is still queued at its deadline: the engine fails it instead of running it
    for _ in range(5):
        executions = _metric(server, "nv_inference_exec_count", model="bert")
        reply = httpx.post(f"http://{server.http}/v2/models/bert/infer", json=body(1), timeout=60)
        if reply.status_code == 504 and "did not start within its deadline" in reply.json()["error"]:
            break
    assert reply.status_code == 504 and "did not start within its deadline" in reply.json()["error"], reply.text
    assert _metric(server, "nv_inference_exec_count", model="bert") == executions  # it never ran
    # with room to wait, the same requests are all served
    assert {r.status_code for r in _post_many(server, "bert", body(60_000_000, priority=1), 2)} == {200}


def test_the_only_request_of_a_fast_model_is_awaited_inline_and_two_are_not(server):
    """inline_outputs: the calling thread waits itself only for the one request the server holds (every model's
    pending requests summed by the engine), of a model whose recent compute time is short; its outputs are the run's."""
    from tvmsched.runtime import Runtime
    from tvmsched.serve.repository import ModelSpec
    from tvmsched.serve.service import InferenceService

    runtime = Runtime("cpu")
    try:
        service = InferenceService(runtime)
        mlp = service.add(ModelSpec("mlp", str(server.repository / "mlp" / "mlp.tvms"), warmup=False))
        bert = service.add(ModelSpec("bert", str(server.repository / "bert" / "bert.tvms"), warmup=False))
        inputs = {"input": mlp_input(3)}
        want = server.reference("mlp", inputs)["output"]
        first = service.submit(mlp, inputs)
        assert service.inline_outputs(mlp, first) is None  # no compute time known yet: awaited as usual
        first.result(timeout=60)
        service.finish(mlp, first, 0, None)
        assert 0 < mlp.compute_s <= 0.002
        inline = None
        for _ in range(20):  # (None when one run takes over twice the recent time: a stall of this machine)
            future = service.submit(mlp, inputs)
            inline = service.inline_outputs(mlp, future)
            future.result(timeout=60)
            service.finish(mlp, future, 0, None)
            if inline is not None:
                break
        np.testing.assert_allclose(inline["output"], want, rtol=1e-4, atol=1e-4)
        assert bert.book.admit() == 0  # another model's request admitted, not answered yet (nothing runs for it)
        for _ in range(5):
            future = service.submit(mlp, inputs)
            assert service.inline_outputs(mlp, future) is None  # at once: two requests are held
            future.result(timeout=60)
            service.finish(mlp, future, 0, None)
        bert.book.release()
        assert mlp.book.pending() == bert.book.pending() == 0
    finally:
        runtime.shutdown()


def test_admission_caps_the_queue_and_refuses_what_cannot_start_in_time(server):
    """The admission rules themselves, in this process and without timing luck: over HTTP an idle server answers a fast
    model's requests one by one (the event loop waits for each, service.outputs), so whether another is ahead
    depends on the machine. Here one request is held admitted and unanswered while the next arrives."""
    from tvmsched.runtime import Runtime
    from tvmsched.serve.repository import ModelSpec
    from tvmsched.serve.service import InferenceService, ServeError

    runtime = Runtime("cpu")
    try:
        service = InferenceService(runtime)
        served = service.add(ModelSpec("bert", str(server.repository / "bert" / "bert.tvms"), warmup=False,
                                        max_queue=2))
        inputs = {"hidden_states": bert_input(7)}
        want = server.reference("bert", inputs)["output"]
        first = service.submit(served, inputs)
        first.result(timeout=60)
        service.finish(served, first, 0, None)
        assert served.compute_s > 0 and served.book.pending() == 0
        each_us = served.compute_s * 1e6
        ahead = service.submit(served, inputs)  # admitted; counted as pending until `finish`, run or not
        with pytest.raises(ServeError, match=r"cannot start this request within its timeout of \d+ µs: 1 requests are "
                                              r"ahead of it") as err:
            service.submit(served, inputs, {"timeout": max(1, int(each_us / 2))})
        assert err.value.status == 504 and served.book.pending() == 1  # refused before it was queued
        roomy = service.submit(served, inputs, {"timeout": int(each_us * 1000)})  # room for the one ahead: queued
        with pytest.raises(ServeError, match=r"has 2 requests queued or running, its limit \(max_queue 2\)") as err:
            service.submit(served, inputs)
        assert err.value.status == 503 and served.book.pending() == 2
        for future in (ahead, roomy):
            np.testing.assert_allclose(future.result(timeout=60)["output"], want, rtol=1e-3, atol=1e-4)
            service.finish(served, future, 0, None)
        success = service.statistics("bert")["model_stats"][0]["inference_stats"]["success"]["count"]
        assert served.book.pending() == 0 and success == 3
    finally:
        runtime.shutdown()


def test_metrics_use_tritons_names(server, client):
    before = _metric(server, "nv_inference_request_success", model="mlp")
    infer(client, "mlp", "input", mlp_input(7), False)
    text = httpx.get(f"http://{server.http}/metrics", timeout=10).text
    assert _metric(server, "nv_inference_request_success", model="mlp") == before + 1
    for name in ("nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
                 "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                 "nv_inference_compute_infer_duration_us", "nv_inference_pending_request_count",
                 "tvmsched_preemptions_total", "tvmsched_qos_violations_total"):
        assert re.search(rf'^{name}{{model="mlp"(,version="1")?}} ', text, re.M), name
    assert "# TYPE nv_inference_request_success counter" in text
    # mlp is served on two streams (config "streams": 2): its launches are both streams', warm-up included (one request
    # of its 4 layers each: one candidate per layer), with every served request's
    executions = _metric(server, "nv_inference_exec_count", model="mlp")
    assert _metric(server, "tvmsched_launches_total", model="mlp") == 4 * (executions + 2)
    assert "nv_gpu_utilization" not in text  # no GPU here: NVML's gauges are absent, silently


def _metric(server, name, **labels):
    text = httpx.get(f"http://{server.http}/metrics", timeout=10).text
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}{{{want}[^}}]*}} (\S+)$", text, re.M)
    return float(match.group(1))


@pytest.mark.parametrize("args,fragment", [
    ([], "nothing to serve"),
    (["--model", "m"], "is not NAME=ARTIFACT"),
    (["--model", "m=/no/such.tvms"], "no artifact file at /no/such.tvms"),
    (["--model", "m=x.tvms:5:urgent"], "priority must be one of"),
    (["--model-repository", "/no/such/folder"], "not a folder"),
    (["--model", "m=x.tvms", "--memory-budget", "lots"], "lots"),
])
def test_bad_flags_are_one_error_line(args, fragment):
    assert_user_error(run_cli("serve", "--port", str(free_port()), "--grpc-port", "0", *args, timeout=120), fragment)


def test_a_port_in_use_is_one_error_line(server):
    port = int(server.http.rsplit(":", 1)[1])
    assert_user_error(run_cli("serve", "--model", "m=x.tvms", "--port", str(port), "--grpc-port", "0", timeout=120),
                      f"cannot listen on 127.0.0.1:{port}")


@pytest.mark.parametrize("config,fragment", [
    ('{"qos_ms": "fast"}', "qos_ms has the wrong type"),
    ('{"priority": "urgent"}', "priority must be one of"),
    ('{"batch": 4}', "unknown key 'batch'"),
    ('{"streams": 0}', "streams must be from 1 to 64"),
    ('{"streams": 2.0}', "streams has the wrong type"),
    ("{not json", "cannot read"),
])
def test_a_bad_repository_config_is_one_error_line(server, tmp_path, config, fragment):
    folder = tmp_path / "repo" / "m"
    folder.mkdir(parents=True)
    (folder / "m.tvms").write_bytes((server.repository / "mlp" / "mlp.tvms").read_bytes())
    (folder / "config.json").write_text(config)
    assert_user_error(run_cli("serve", "--model-repository", str(tmp_path / "repo"), "--port", str(free_port()),
                              "--grpc-port", "0", timeout=120), fragment)


def test_trust_refuses_an_unsigned_artifact(server, tmp_path, cli):
    keys = cli("keys", "generate", str(tmp_path / "me"))
    assert keys.returncode == 0, keys.stderr
    artifact = server.repository / "mlp" / "mlp.tvms"  # not signed
    assert_user_error(run_cli("serve", "--model", f"m={artifact}", "--trust", str(tmp_path / "me.pub"),
                              "--port", str(free_port()), "--grpc-port", "0", timeout=120), "sign")


def test_a_body_over_the_limit_is_413_before_it_is_read(server):
    reply = httpx.post(f"http://{server.http}/v2/models/mlp/infer", content=b"\0" * ((16 << 20) + 1), timeout=60)
    assert reply.status_code == 413 and reply.json()["error"] == f"request body larger than {16 << 20} bytes"


def test_infer_answers_carry_the_request_id_and_a_chunked_body_over_the_limit_is_413(server):
    """The infer route is answered before FastAPI's middleware (serve/http.py InferRoute): it does their part itself."""
    url = f"http://{server.http}/v2/models/mlp/infer"
    x = np.zeros((1, 784), np.float32)
    good = httpx.post(url, json={"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 784], "data": x.ravel().tolist()}]},
                      headers={"X-Request-Id": "abc-1"}, timeout=60)
    bad = httpx.post(url, content=b"{", headers={"X-Request-Id": "abc-2"}, timeout=60)
    assert (good.status_code, good.headers["x-request-id"]) == (200, "abc-1"), good.text
    assert (bad.status_code, bad.headers["x-request-id"]) == (400, "abc-2") and "not valid JSON" in bad.json()["error"]
    chunked = httpx.post(url, content=iter([b"\0" * (8 << 20)] * 3), timeout=60)  # no Content-Length: read until past
    assert chunked.status_code == 413 and chunked.json()["error"] == f"request body larger than {16 << 20} bytes"
