"""Bad input and non-finite outputs, alike in both HTTP servers (issue 38): `tvmsched serve` and build/cpp/tvmsched_server
get the same hostile requests, and each answers every one with the same status and one strict-JSON error line; NaN
and infinite outputs are strict JSON in both (the strings "NaN", "Infinity", "-Infinity": the engine's codec,
runtime/native/src/kserve.cc, which both servers use), equal to what the binary tensor extension carries and decoded
back by tritonclient.

The model is tests/test_nan_semantics.py's one-op LeakyRelu (x: FP32 [8] -> y), the shared artifact that test runs:
LeakyRelu keeps NaN, maps inf to inf and -inf to -inf (times alpha), so one answer holds all three. The C++ half is
skipped where the C++ examples cannot be built (tests/test_cpp_examples.py's fixture).
"""

from __future__ import annotations

import gzip
import json

import httpx
import numpy as np
import pytest

from tests.helpers import start_cpp_server, start_serve, stop_server
from tests.test_cpp_examples import cpp_build  # noqa: F401 (the fixture: `make cpp` once)
from tests.test_nan_semantics import CASES, X

tritonclient_http = pytest.importorskip("tritonclient.http")

MODEL = CASES["LeakyRelu"]
INFER = "/v2/models/leaky/infer"
DEEP = 100_000


def strict_json(text: bytes | str):
    """json.loads refusing NaN, Infinity and -Infinity (which Python's parser takes by default, and JSON has not)."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def artifact(compiled):
    return compiled(MODEL)  # shared, read only (test_nan_semantics compiles the same entry)


@pytest.fixture(scope="module")
def serve_server(artifact):
    process, base, grpc = start_serve("--model", f"leaky={artifact}", "--no-warmup")
    yield base, grpc
    assert stop_server(process) == 0


@pytest.fixture(scope="module")
def cpp_server(cpp_build, artifact):  # noqa: F811
    process, base = start_cpp_server(cpp_build / "tvmsched_server", "--model", f"leaky={artifact}")
    yield base, None
    assert stop_server(process) == 0


@pytest.fixture(params=["serve", "cpp"])
def base(request) -> str:
    return request.getfixturevalue(f"{request.param}_server")[0]


def _tensor(data, **fields) -> dict:
    return {"name": "x", "datatype": "FP32", "shape": [8], "data": data, **fields}


def _body(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def _nested(levels: int) -> bytes:
    """A request whose JSON nests `levels` (4 or more) deep: its data wrapped in lists (the object, "inputs", the input
    and the data list are 4)."""
    wraps = levels - 4
    return b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [8], "data": ' + b"[" * wraps + \
        json.dumps(X_STRINGS).encode() + b"]" * wraps + b"}]}"


ONES = [1.0] * 8
X_STRINGS = ["NaN", "-Infinity", "Infinity", -2.0, 0.5, 3.0, -0.0, "NaN"]  # X as JSON data: non-finite values as strings
assert np.array_equal(np.array(X_STRINGS, np.float32), X, equal_nan=True)
HINT = 'send non-finite values as the strings "NaN", "Infinity", "-Infinity", or as binary data'
# (what, path, body, headers, status, fragment of the error line (both servers))
HOSTILE = [
    ("data nested 100000 deep", INFER, b'{"inputs": ' + b"[" * DEEP + b"]" * DEEP + b"}", {}, 400,
     "the request nests deeper than 64 levels"),
    ("a bare list 100000 deep, unclosed", INFER, b"[" * DEEP, {}, 400, "nests deeper than 64 levels"),
    ("objects 100000 deep", INFER, b'{"a":' * DEEP + b"1" + b"}" * DEEP, {}, 400, "nests deeper than 64 levels"),
    ("65 levels", INFER, _nested(65), {}, 400, "nests deeper than 64 levels"),
    ("deep after a binary header", INFER, b"[" * DEEP, {"Inference-Header-Content-Length": str(DEEP)}, 400,
     "nests deeper than 64 levels"),
    ("/v1 body 100000 deep", "/v1/models/leaky/infer", b'{"inputs": {"x": ' + b"[" * DEEP + b"]" * DEEP + b"}}", {},
     400, "the body nests deeper than 64 levels"),
    ("bare NaN", INFER, _body(_tensor([1.0] * 7)).replace(b"]}]", b", NaN]}]"), {}, 400, HINT),
    ("bare -Infinity", INFER, _body(_tensor([1.0] * 7)).replace(b"]}]", b", -Infinity]}]"), {}, 400, HINT),
    ("bare Infinity in parameters", INFER, _body(_tensor(ONES)).replace(b"]}]", b"]}], \"parameters\": {\"a\": Infinity}"),
     {}, 400, HINT),
    ("a lowercase nan string", INFER, _body(_tensor(["nan"] + ONES[1:])), {}, 400, "which is not a FP32 value"),
    ("a boolean as FP32", INFER, _body(_tensor([True] + ONES[1:])), {}, 400, "which is not a FP32 value"),
    ("null as FP32", INFER, _body(_tensor([None] + ONES[1:])), {}, 400, "which is not a FP32 value"),
    ("an object as FP32", INFER, _body(_tensor([{}] + ONES[1:])), {}, 400, "which is not a FP32 value"),
    ("a float dimension", INFER, _body(_tensor(ONES, shape=[8.0])), {}, 400, "shape"),
    ("a string shape", INFER, _body(_tensor(ONES, shape="8")), {}, 400, "shape"),
    ("a number id", INFER, _body(_tensor(ONES), id=5), {}, 400, "must be a string"),
    ("parameters a list", INFER, _body(_tensor(ONES), parameters=[]), {}, 400, "must be an object"),
    ("input parameters a string", INFER, _body(_tensor(ONES, parameters="x")), {}, 400, "must be an object"),
    ("binary_data_output a string", INFER, _body(_tensor(ONES), parameters={"binary_data_output": "yes"}), {}, 400,
     "must be true or false"),
    ("binary_data a number", INFER, _body(_tensor(ONES), outputs=[{"name": "y", "parameters": {"binary_data": 1}}]),
     {}, 400, "must be true or false"),
    ("an output twice", INFER, _body(_tensor(ONES), outputs=[{"name": "y"}, {"name": "y"}]), {}, 400,
     "is requested twice"),
    ("classification", INFER, _body(_tensor(ONES), outputs=[{"name": "y", "parameters": {"classification": 2}}]), {},
     400, "classification"),
    ("outputs an object", INFER, _body(_tensor(ONES), outputs={}), {}, 400, "outputs"),
    ("data and binary data", INFER, _body(_tensor(ONES, parameters={"binary_data_size": 32})) + bytes(32),
     {"Inference-Header-Content-Length": str(len(_body(_tensor(ONES, parameters={"binary_data_size": 32}))))}, 400,
     "both"),
    ("invalid UTF-8", INFER, _body(_tensor(ONES), id="?").replace(b'"?"', b'"\xff"'), {}, 400, "not valid JSON"),
    ("a lone surrogate escape in the id", INFER, _body(_tensor(ONES), id="?").replace(b'"?"', rb'"\ud800"'), {}, 400,
     "not valid JSON"),
    ("a lone surrogate escape in a key", INFER, _body(_tensor(ONES), parameters={"?": 1}).replace(b'"?"', rb'"\udc00"'),
     {}, 400, "not valid JSON"),
    ("UTF-16", INFER, _body(_tensor(ONES)).decode().encode("utf-16"), {}, 400, "not valid JSON"),
    ("an empty body", INFER, b"", {}, 400, "not valid JSON"),
    ("a datatype of 100000 numbers", INFER, _body(_tensor(ONES, datatype=list(range(DEEP)))), {}, 400, "datatype"),
    ("a name that is a number", INFER, _body(_tensor(ONES, name=1)), {}, 400, "name"),
    ("inputs an object", INFER, json.dumps({"inputs": {"x": ONES}}).encode(), {}, 400, "inputs"),
]


@pytest.mark.parametrize("what,path,body,headers,status,fragment", HOSTILE, ids=[case[0] for case in HOSTILE])
def test_hostile_requests_get_one_strict_json_error_line(base, what, path, body, headers, status, fragment):
    reply = httpx.post(base + path, content=body, headers={"content-type": "application/json", **headers}, timeout=60)
    assert reply.status_code == status, (what, reply.status_code, reply.text[:500])
    error = strict_json(reply.content)
    key = "detail" if path.startswith("/v1/") else "error"
    assert list(error) == [key] and isinstance(error[key], str), error
    line = error[key]
    assert fragment in line and "\n" not in line and "Traceback" not in line and len(line) < 400, (what, line)
    assert httpx.get(f"{base}/v2/models/leaky/ready", timeout=10).status_code == 200  # and it still serves


@pytest.mark.parametrize("levels", [64, 4])
def test_json_up_to_64_levels_and_deep_strings_are_served(base, levels):
    """64 levels are the limit, not past it; brackets inside strings are no nesting (a 100000-'[' id is echoed)."""
    reply = httpx.post(base + INFER, content=_nested(levels), timeout=60)
    assert reply.status_code == 200, reply.text[:500]
    deep_id = "[" * DEEP
    reply = httpx.post(base + INFER, content=_body(_tensor(ONES), id=deep_id), timeout=60)
    assert reply.status_code == 200 and strict_json(reply.content)["id"] == deep_id


def _expected() -> np.ndarray:
    alpha = 0.01  # ONNX LeakyRelu's default
    with np.errstate(invalid="ignore"):
        return np.where(X < 0, X * np.float32(alpha), X).astype(np.float32)


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)  # infinities of the same sign included


def _json_answer(base: str, data, *, binary_input: bool = False) -> tuple[bytes, dict]:
    """The JSON answer to the model run on X (sent as JSON `data`, or as binary bytes), strictly parsed."""
    if binary_input:
        header = _body({"name": "x", "datatype": "FP32", "shape": [8], "parameters": {"binary_data_size": X.nbytes}})
        reply = httpx.post(base + INFER, content=header + X.tobytes(), timeout=60,
                           headers={"Inference-Header-Content-Length": str(len(header))})
    else:
        reply = httpx.post(base + INFER, content=_body(_tensor(data)), timeout=60)
    assert reply.status_code == 200 and "Inference-Header-Content-Length" not in reply.headers, reply.text
    return reply.content, strict_json(reply.content)


def test_non_finite_outputs_are_strict_json_strings(base):
    """NaN, inf and -inf come out as "NaN", "Infinity", "-Infinity" (not the bare literals JSON lacks), element by
    element where the binary answer has them; tritonclient's as_numpy reads them back to the same floats; the strings
    are taken as input data too (a JSON answer can be sent back as is), as binary input is."""
    want = _expected()
    for content, answer in (_json_answer(base, X_STRINGS), _json_answer(base, None, binary_input=True)):
        (output,) = answer["outputs"]
        assert (output["name"], output["datatype"], output["shape"]) == ("y", "FP32", [8])
        assert output["data"][:3] == ["NaN", "-Infinity", "Infinity"] and output["data"][7] == "NaN", output["data"]
        assert all(isinstance(v, float) for v in output["data"][3:7]), output["data"]
        _same(tritonclient_http.InferResult.from_response_body(content).as_numpy("y"), want)
    # the binary tensor extension carries them as they are
    header = _body({"name": "x", "datatype": "FP32", "shape": [8], "parameters": {"binary_data_size": X.nbytes}},
                   parameters={"binary_data_output": True})
    reply = httpx.post(base + INFER, content=header + X.tobytes(), timeout=60,
                       headers={"Inference-Header-Content-Length": str(len(header))})
    length = int(reply.headers["Inference-Header-Content-Length"])
    strict_json(reply.content[:length])
    _same(np.frombuffer(reply.content[length:], np.float32), want)


def test_tritonclient_json_outputs_decode_non_finite_values(base):
    client = tritonclient_http.InferenceServerClient(base.removeprefix("http://"))
    try:
        tensor = tritonclient_http.InferInput("x", [8], "FP32")
        tensor.set_data_from_numpy(X)  # binary input: tritonclient's JSON input would write bare NaN (refused: HOSTILE)
        result = client.infer("leaky", [tensor], outputs=[tritonclient_http.InferRequestedOutput("y", binary_data=False)])
        _same(result.as_numpy("y"), _expected())
    finally:
        client.close()


def test_v1_outputs_are_strict_json_too(base):
    reply = httpx.post(f"{base}/v1/models/leaky/infer", json={"inputs": {"x": X_STRINGS}}, timeout=60)
    assert reply.status_code == 200, reply.text
    output = strict_json(reply.content)["outputs"]["y"]
    assert output[:3] == ["NaN", "-Infinity", "Infinity"] and output[7] == "NaN", output
    _same(np.array(output, np.float32), _expected())


def test_both_servers_answer_alike(serve_server, cpp_server):
    """The same hostile requests, the same statuses; the same JSON outputs, byte for byte apart from formatting."""
    python, cpp = serve_server[0], cpp_server[0]
    for what, path, body, headers, _, _ in HOSTILE:
        replies = [httpx.post(b + path, content=body, headers=headers, timeout=60) for b in (python, cpp)]
        assert replies[0].status_code == replies[1].status_code, (what, [r.text[:300] for r in replies])
    answers = [_json_answer(b, None, binary_input=True)[1] for b in (python, cpp)]
    assert answers[0]["outputs"] == answers[1]["outputs"]


def test_serve_refuses_a_gzip_bomb_with_413(serve_server):
    """A small gzip body that inflates past --max-body-bytes (16 MiB) is refused as a body that large would be, not
    inflated into memory (the C++ server takes no Content-Encoding)."""
    bomb = gzip.compress(b" " * (64 << 20))
    assert len(bomb) < 1 << 20
    reply = httpx.post(serve_server[0] + INFER, content=bomb, headers={"Content-Encoding": "gzip"}, timeout=60)
    assert reply.status_code == 413 and "inflates to more than 16777216 bytes" in strict_json(reply.content)["error"]
    reply = httpx.post(serve_server[0] + INFER, content=gzip.compress(_body(_tensor(ONES))),
                       headers={"Content-Encoding": "gzip"}, timeout=60)
    assert reply.status_code == 200, reply.text


def test_grpc_deep_nesting_is_refused_and_the_server_lives_on(serve_server):
    """Protobuf messages of the KServe proto do not nest, but a client can send unknown fields nested as groups
    100000 deep: protobuf's decoder stops at its recursion limit (100), the call fails with INVALID_ARGUMENT and one
    line (grpc's own answer was UNKNOWN naming a Python exception), and the server answers the next call."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb2  # Triton's messages (not tvmsched's stubs: one pool, one of them)

    start, end = bytes([(99 << 3 | 3) & 0x7F | 0x80, 99 >> 4]), bytes([(99 << 3 | 4) & 0x7F | 0x80, 99 >> 4])
    nested = start * DEEP + end * DEEP  # field 99, start-group/end-group, 100000 deep
    with grpc.insecure_channel(serve_server[1]) as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                  request_serializer=lambda b: b, response_deserializer=lambda b: b)
        with pytest.raises(grpc.RpcError) as err:
            raw(nested, timeout=60)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
        assert "message protobuf can decode" in err.value.details() and "\n" not in err.value.details()
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                   request_serializer=pb2.ServerLiveRequest.SerializeToString,
                                   response_deserializer=pb2.ServerLiveResponse.FromString)
        assert live(pb2.ServerLiveRequest(), timeout=60).live
