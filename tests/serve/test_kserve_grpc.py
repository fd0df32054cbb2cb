"""`tvmsched serve` over gRPC (inference.GRPCInferenceService): tritonclient.grpc, and Triton's own generated stub
for what tritonclient does not send (typed contents), against a real server on 127.0.0.1."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.serve import kserve_server
from tests.serve.kserve_server import bert_input, mlp_input


@pytest.fixture(scope="module")
def server(tmp_path_factory, compiled, reference):
    served = kserve_server.start(tmp_path_factory.mktemp("kserve_grpc"), compiled=compiled, reference=reference)
    yield served
    kserve_server.stop(served)


@pytest.fixture()
def client(server):
    client = triton.InferenceServerClient(server.grpc)
    yield client
    client.close()


def infer(client, model, name, array, **kwargs):
    tensor = triton.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor], outputs=[triton.InferRequestedOutput("output")], **kwargs)


def test_outputs_equal_onnxruntime(server, client):
    for model, name, array in (("mlp", "input", mlp_input(1)), ("bert", "hidden_states", bert_input(1))):
        result = infer(client, model, name, array, request_id="g-1")
        np.testing.assert_allclose(result.as_numpy("output"), server.reference(model, {name: array})["output"],
                                   rtol=1e-3, atol=1e-4)
        assert result.get_response().id == "g-1" and result.get_response().model_name == model
    # per-request scheduling parameters pass through
    result = infer(client, "mlp", "input", mlp_input(2), priority=1, timeout=60_000_000)
    np.testing.assert_allclose(result.as_numpy("output"), server.reference("mlp", {"input": mlp_input(2)})["output"],
                               rtol=1e-4, atol=1e-5)


def test_typed_contents_as_well_as_raw(server):
    x = mlp_input(3)
    request = service_pb2.ModelInferRequest(model_name="mlp", id="typed")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[1, 784])
    tensor.contents.fp32_contents.extend(x.ravel().tolist())
    with grpc.insecure_channel(server.grpc) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert answer.id == "typed" and answer.outputs[0].datatype == "FP32" and list(answer.outputs[0].shape) == [1, 10]
    np.testing.assert_allclose(np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(1, 10),
                               server.reference("mlp", {"input": x})["output"], rtol=1e-4, atol=1e-5)


def test_health_metadata_config_statistics_and_repository(server, client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("bert") and not client.is_model_ready("nope")
    assert "binary_tensor_data" in client.get_server_metadata().extensions
    meta = client.get_model_metadata("bert", as_json=True)
    assert meta["inputs"] == [{"name": "hidden_states", "datatype": "FP32", "shape": ["1", "128", "128"]}]
    config = client.get_model_config("mlp", as_json=True)["config"]
    assert config["input"] == [{"name": "input", "data_type": "TYPE_FP32", "dims": ["1", "784"]}]
    assert config["backend"] == "tvmsched" and config.get("max_batch_size", 0) == 0
    before = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    infer(client, "mlp", "input", mlp_input(4))
    after = client.get_inference_statistics("mlp", as_json=True)["model_stats"][0]
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 1
    assert int(after["inference_stats"]["compute_infer"]["ns"]) > int(before["inference_stats"]["compute_infer"].get("ns", 0))
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index == {"mlp": "READY", "bert": "READY"}
    client.unload_model("bert")
    assert not client.is_model_ready("bert")
    assert {m.name: m.state for m in client.get_model_repository_index().models}["bert"] == "UNAVAILABLE"
    client.load_model("bert")
    h = bert_input(5)
    np.testing.assert_allclose(infer(client, "bert", "hidden_states", h).as_numpy("output"),
                               server.reference("bert", {"hidden_states": h})["output"], rtol=1e-3, atol=1e-4)


def test_errors_carry_grpc_codes_and_one_line(server, client):
    cases = [
        (lambda: infer(client, "nope", "input", mlp_input(0)), "StatusCode.NOT_FOUND", "no model named 'nope' is loaded"),
        (lambda: infer(client, "mlp", "input", mlp_input(0)[:, :700]), "StatusCode.INVALID_ARGUMENT",
         "input 'input' has shape [1,700] but model 'mlp' expects [1,784]"),  # (the REST route's lines: one codec)
        (lambda: infer(client, "mlp", "x", mlp_input(0)), "StatusCode.INVALID_ARGUMENT", "has no input named 'x'"),
        (lambda: client.get_model_metadata("nope"), "StatusCode.NOT_FOUND", "no model named 'nope' is loaded"),
        (lambda: client.load_model("resnet"), "StatusCode.NOT_FOUND", "no model named 'resnet'"),
        (lambda: client.load_model("mlp", config="{}"), "StatusCode.INVALID_ARGUMENT",
         "load parameter 'config' is not supported"),  # (not loaded from its folder as if applied)
    ]
    for call, code, fragment in cases:
        with pytest.raises(InferenceServerException) as err:
            call()
        assert err.value.status() == code and fragment in err.value.message(), (code, err.value)
        assert "\n" not in err.value.message()
    request = service_pb2.ModelInferRequest(model_name="mlp")  # tritonclient refuses to send this one itself
    request.inputs.add(name="input", datatype="FP32", shape=[1, 784]).contents.fp32_contents.extend([0.0] * 784)
    request.parameters["timeout"].string_param = "soon"
    with grpc.insecure_channel(server.grpc) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "parameter timeout" in err.value.details()
    tensor = triton.InferInput("input", [1, 784], "INT64")
    tensor.set_data_from_numpy(np.zeros((1, 784), np.int64))
    with pytest.raises(InferenceServerException, match="has datatype 'INT64' but model 'mlp' expects FP32"):
        client.infer("mlp", [tensor])


def test_queue_cap_is_unavailable_and_a_late_start_deadline_exceeded(server):
    h = bert_input(6)

    def one(timeout):
        with triton.InferenceServerClient(server.grpc) as own:
            try:
                infer(own, "bert", "hidden_states", h, timeout=timeout)
                return "OK"
            except InferenceServerException as err:
                return err.status()

    with ThreadPoolExecutor(16) as pool:  # bert's max_queue is 2; how many overlap depends on the machine
        codes = list(pool.map(one, [0] * 16))
    assert set(codes) <= {"OK", "StatusCode.UNAVAILABLE"} and "OK" in codes, codes
    # timeout 1 µs: still queued at its deadline, the engine fails it (test_kserve_http tests the admission rule)
    assert one(1) == "StatusCode.DEADLINE_EXCEEDED"
    assert one(60_000_000) == "OK"
