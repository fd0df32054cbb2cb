"""The engine's Open Inference Protocol codec (runtime/native/src/kserve.cc), called as `tvmsched serve` calls it:
FP16 elements of JSON data against numpy's conversion, outputs nested or flat, and answers a strict parser reads."""

import json

import numpy as np
import pytest
import tvm_ffi

from tvmsched.runtime import native


def _codec(dtype: str, shape: list[int]):
    native.engine()
    return native.func("kserve_codec")("m", "1", [["x", dtype, shape]], [["y", dtype, shape]])[:2]  # (REST's)


def _strict(text: bytes):
    def refuse(name):
        raise ValueError(f"bare {name}")
    return json.loads(text, parse_constant=refuse)


def test_fp16_json_data_rounds_as_numpy_and_comes_back_as_the_same_halves():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(0, 1, 200), rng.normal(0, 1e4, 100), rng.normal(0, 1e-6, 100),  # subnormals
                             [65504, 65519.99, 65520, -70000, 2 ** -24, 2 ** -25, 3 * 2 ** -26, 0.0, -0.0]])
    data = [float(v) for v in values] + ["NaN", "-Infinity"]
    parse, encode = _codec("FP16", [len(data)])
    parsed = parse(json.dumps({"inputs": [{"name": "x", "datatype": "FP16", "shape": [len(data)], "data": data}]}).encode(), None)
    assert parsed[0] == 0, parsed
    got = np.from_dlpack(parsed[1]["x"])
    with np.errstate(over="ignore"):  # past 65504 is infinity
        expected = np.array(values, np.float32).astype(np.float16)  # the codec rounds through float32 as numpy here
    assert np.array_equal(got[:len(values)].view(np.uint16), expected.view(np.uint16))
    assert np.isnan(got[-2]) and got[-1] == -np.inf
    answer = encode(parsed[3], {"y": tvm_ffi.from_dlpack(got.copy())})
    assert answer[0] == 0 and answer[2] == -1
    out = _strict(bytes(answer[1]))["outputs"][0]
    back = np.array([{"NaN": np.nan, "-Infinity": -np.inf, "Infinity": np.inf}.get(v, v) for v in out["data"]], np.float16)
    assert np.array_equal(back.view(np.uint16)[:-2], got.view(np.uint16)[:-2]) and np.isnan(back[-2])


@pytest.mark.parametrize("dtype,numpy", [("FP32", np.float32), ("FP64", np.float64), ("INT64", np.int64), ("BOOL", np.bool_)])
def test_outputs_read_back_bit_identical_flat_and_binary(dtype, numpy):
    rng = np.random.default_rng(1)
    y = rng.normal(0, 100, (2, 3, 4)).astype(numpy)
    if dtype.startswith("FP"):
        y.flat[:4] = [np.nan, np.inf, -np.inf, -0.0]
    parse, encode = _codec(dtype, [2, 3, 4])
    header = json.dumps({"id": "a\"b", "inputs": [{"name": "x", "datatype": dtype, "shape": [2, 3, 4],
                                                    "parameters": {"binary_data_size": y.nbytes}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": False}}]}).encode()
    parsed = parse(header + y.tobytes(), str(len(header)))
    assert parsed[0] == 0, parsed
    assert np.array_equal(np.from_dlpack(parsed[1]["x"]), y, equal_nan=True)
    answer = encode(parsed[3], {"y": tvm_ffi.from_dlpack(y)})
    body = _strict(bytes(answer[1]))
    assert body["id"] == 'a"b' and body["outputs"][0]["shape"] == [2, 3, 4]
    data = body["outputs"][0]["data"]
    assert len(data) == y.size and all(not isinstance(v, list) for v in data)  # flat, as the protocol sends it
    if dtype.startswith("FP"):
        assert all(isinstance(v, float) for v in data[4:])  # 3.0, never 3: a float stays a float
        data = [{"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(v, v) for v in data]
    back = np.array(data, numpy).reshape(y.shape)
    assert np.array_equal(back.view(np.uint8), y.view(np.uint8))  # bit-identical: -0.0 and NaN included


ACCEPTED = ["0", "-0", "-0.0", "1e3", "1E+3", "2.5e-3", "-1.25", "1e-310", "123456789012345678901234567890", "1e400",
            "-1e400", "0.1", "9007199254740993", "[1.5]", "[[[2]]]"]
REFUSED = ["01", "1.", ".5", "-", "1e", "+1", "0x10", "[1,]", "[1 2]", "tru", "nul", '"a', "[", "]", "[1,,2]", "1 2"]


@pytest.mark.parametrize("number", ACCEPTED)
def test_numbers_read_as_python_reads_them(number):
    """The engine's JSON reader (runtime/native/src/json_reader.h) against Python's json module: FP64 data."""
    parse, _ = _codec("FP64", [1])
    parsed = parse(b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": %s}]}' % number.encode(), None)
    assert parsed[0] == 0, parsed
    expected = np.array(json.loads(number), np.float64).reshape(1)
    assert np.from_dlpack(parsed[1]["x"]).view(np.uint64).tolist() == expected.view(np.uint64).tolist()


@pytest.mark.parametrize("data", REFUSED)
def test_malformed_json_is_one_400_line(data):
    parse, _ = _codec("FP64", [1])
    body = b'{"inputs": [{"name": "x", "datatype": "FP64", "shape": [1], "data": %s}]}' % data.encode()
    with pytest.raises(ValueError):
        json.loads(body)  # Python refuses it too
    status, line = parse(body, None)
    assert status == 400 and line.startswith("the request is not valid JSON: ") and "\n" not in line, line


def test_strings_escapes_keys_and_integers():
    parse, encode = _codec("INT64", [2])
    body = ('{"id": "caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\ \\/ \\t", "inputs": [{"name": "x", "datatype": "INT64", '
            '"shape": [2], "data": [1, 2], "data": [-9223372036854775808, 9223372036854775807]}]}').encode()
    parsed = parse(body, None)
    assert parsed[0] == 0, parsed  # a repeated key: the last one counts, as Python's json reads it
    assert np.from_dlpack(parsed[1]["x"]).tolist() == json.loads(body)["inputs"][0]["data"]
    answer = encode(parsed[3], {"y": tvm_ffi.from_dlpack(np.array([1, 2], np.int64))})
    assert _strict(bytes(answer[1]))["id"] == json.loads(body)["id"]
    for bad, fragment in [(b'{"id": "\\ud800", "inputs": []}', "surrogate"), (b'{"id": "\\udc00x", "inputs": []}', "surrogate"),
                          (b'{"id": "a\x01", "inputs": []}', "control character"), (b'{"id": "\\x", "inputs": []}', "escape"),
                          (b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 1e30]}]}', "holds 1e+30"),
                          (b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 9223372036854775808]}]}', "which is not a INT64 value")]:
        status, line = parse(bad, None)
        assert status == 400 and fragment in line, line


@pytest.mark.parametrize("parameters, want", [
    ({}, [0, -1, 0]), ({"priority": 1}, [0, 1, 0]), ({"priority": "realtime"}, [0, 1, 0]), ({"priority": "1"}, [0, 1, 0]),
    ({"priority": 0}, [0, -1, 0]), ({"priority": ""}, [0, -1, 0]), ({"priority": 2}, [0, 0, 0]),
    ({"priority": "best_effort", "timeout": 250}, [0, 0, 250]), ({"timeout": 0}, [0, -1, 0]),
])
def test_both_servers_read_priority_and_timeout_alike(parameters, want):
    """One reading of Triton's scheduling parameters (kserve::ReadScheduling) for the C++ server and tvmsched serve."""
    assert [int(v) for v in native.func("kserve_scheduling")(parameters)] == want


@pytest.mark.parametrize("parameters, fragment", [
    ({"priority": True}, "parameter priority must be 0 (the model's), 1 or 'realtime' (real-time), 2 or more or "
                         "'best_effort', not true"),
    ({"priority": -1}, "not -1"), ({"priority": "urgent"}, 'not "urgent"'), ({"priority": 1.0}, "not 1.0"),
    ({"timeout": -5}, "parameter timeout must be a whole number of microseconds, 0 or more (0: none), not -5"),
    ({"timeout": "10"}, 'not "10"'), ({"timeout": False}, "not false"), ({"timeout": 2.5}, "not 2.5"),
])
def test_scheduling_parameters_of_another_kind_are_a_400_line(parameters, fragment):
    status, line = native.func("kserve_scheduling")(parameters)
    assert int(status) == 400 and fragment in str(line) and "\n" not in str(line)


# -- gRPC: ModelInferRequest and ModelInferResponse in protobuf's wire format, against Triton's own messages

def _message_codec(dtype: str, shape: list[int]):
    native.engine()
    return native.func("kserve_codec")("m", "1", [["x", dtype, shape]], [["y", dtype, shape]])[2:4]  # (gRPC's)


TYPED = {"BOOL": ("bool_contents", np.bool_), "UINT8": ("uint_contents", np.uint8),
         "UINT16": ("uint_contents", np.uint16), "UINT32": ("uint_contents", np.uint32),
         "UINT64": ("uint64_contents", np.uint64), "INT8": ("int_contents", np.int8),
         "INT16": ("int_contents", np.int16), "INT32": ("int_contents", np.int32),
         "INT64": ("int64_contents", np.int64), "FP32": ("fp32_contents", np.float32),
         "FP64": ("fp64_contents", np.float64), "FP16": (None, np.float16)}


def _extremes(numpy) -> np.ndarray:
    """Six values of the type, its limits among them (negative ones exercise int32's sign-extended varints)."""
    if numpy is np.bool_:
        return np.array([True, False, True, True, False, False])
    if np.issubdtype(numpy, np.integer):
        info = np.iinfo(numpy)
        return np.array([info.min, info.max, 0, 1, info.max // 3, info.min // 5 if info.min else 7], numpy)
    return np.array([np.nan, np.inf, -0.0, 1.5, -3e-5, np.finfo(numpy).max], numpy)


@pytest.mark.parametrize("dtype", list(TYPED))
def test_grpc_messages_read_raw_and_typed_contents_and_answer_what_protobuf_reads(dtype):
    from tritonclient.grpc import service_pb2 as pb2  # Triton's messages, as tritonclient sends them

    field, numpy = TYPED[dtype]
    x = _extremes(numpy).reshape(2, 3)
    parse, encode = _message_codec(dtype, [2, 3])
    raw = pb2.ModelInferRequest(model_name="m", id="r-1", raw_input_contents=[x.tobytes()])
    raw.inputs.add(name="x", datatype=dtype, shape=[2, 3])
    raw.parameters["priority"].int64_param = 1
    raw.parameters["timeout"].uint64_param = 5000
    raw.parameters["flag"].bool_param = True
    raw.parameters["tag"].string_param = "é"
    raw.parameters["ratio"].double_param = 0.25
    parsed = parse(raw.SerializeToString())
    assert parsed[0] == 0, parsed
    assert np.from_dlpack(parsed[1]["x"]).view(np.uint8).tolist() == x.view(np.uint8).tolist()
    assert dict(parsed[2]) == {"priority": 1, "timeout": 5000, "flag": True, "tag": "é", "ratio": 0.25}
    if field is not None:
        typed = pb2.ModelInferRequest(model_name="m")
        getattr(typed.inputs.add(name="x", datatype=dtype, shape=[2, 3]).contents, field).extend(x.ravel().tolist())
        again = parse(typed.SerializeToString())
        assert again[0] == 0, again
        assert np.from_dlpack(again[1]["x"]).view(np.uint8).tolist() == x.view(np.uint8).tolist()
    else:  # FP16 has no typed contents in the proto
        typed = pb2.ModelInferRequest(model_name="m")
        typed.inputs.add(name="x", datatype=dtype, shape=[2, 3]).contents.fp32_contents.extend([0.0] * 6)
        status, line = parse(typed.SerializeToString())
        assert status == 400 and "send it in raw_input_contents" in line, line
    y = x[::-1].copy()
    answer = encode(parsed[3], {"y": tvm_ffi.from_dlpack(y)})
    assert answer[0] == 0, answer
    response = pb2.ModelInferResponse.FromString(bytes(answer[1]))
    assert (response.model_name, response.model_version, response.id) == ("m", "1", "r-1")
    assert [(o.name, o.datatype, list(o.shape)) for o in response.outputs] == [("y", dtype, [2, 3])]
    assert list(response.raw_output_contents) == [y.tobytes()]


def test_grpc_messages_refused_with_the_rest_routes_lines():
    from tritonclient.grpc import service_pb2 as pb2

    parse, _ = _message_codec("INT8", [2])

    def request(**tensor):
        message = pb2.ModelInferRequest(model_name="m")
        contents = tensor.pop("contents", None)
        added = message.inputs.add(**tensor)
        if contents is not None:
            added.contents.int_contents.extend(contents)
        return message

    cases = [
        (request(name="x", datatype="INT8", shape=[3], contents=[1, 2, 3]), "input 'x' has shape [3] but model 'm' expects [2]"),
        (request(name="z", datatype="INT8", shape=[2], contents=[1, 2]), "model 'm' has no input named 'z' (its inputs: 'x')"),
        (request(name="x", datatype="INT16", shape=[2], contents=[1, 2]), "has datatype 'INT16' but model 'm' expects INT8"),
        (request(name="x", datatype="INT8", shape=[2], contents=[1]), "input 'x' has 1 elements in its contents; its shape [2] needs 2"),
        (request(name="x", datatype="INT8", shape=[2], contents=[1, -129]), "input 'x' holds -129, which is not a INT8 value"),
        (request(name="x", datatype="INT8", shape=[-2], contents=[1, 2]), "has a shape with the dimension -2, not a size"),
        (request(name="x", datatype="INT8", shape=[2]), "input 'x' has neither raw_input_contents nor contents"),
        (pb2.ModelInferRequest(model_name="m"), "model 'm' needs input 'x', which the request does not give"),
    ]
    wrong_raw = request(name="x", datatype="INT8", shape=[2])
    wrong_raw.raw_input_contents.extend([b"\x01\x02\x03"])
    cases.append((wrong_raw, "input 'x' has 3 bytes of raw_input_contents but its shape [2] of INT8 needs 2 bytes"))
    two_raw = request(name="x", datatype="INT8", shape=[2])
    two_raw.raw_input_contents.extend([b"\x01\x02", b"\x03\x04"])
    cases.append((two_raw, "the request has 2 raw_input_contents for its 1 inputs"))
    classify = request(name="x", datatype="INT8", shape=[2], contents=[1, 2])
    classify.outputs.add(name="y").parameters["classification"].int64_param = 3
    cases.append((classify, "output 'y' asks for classification"))
    unknown = request(name="x", datatype="INT8", shape=[2], contents=[1, 2])
    unknown.outputs.add(name="w")
    cases.append((unknown, "model 'm' has no output named 'w' (its outputs: 'y')"))
    for message, fragment in cases:
        status, line = parse(message.SerializeToString())
        assert status == 400 and fragment in line and "\n" not in line, (fragment, line)
    # model_name given twice: protobuf reads the last, which a server peeking at the first would not have chosen
    twice = request(name="x", datatype="INT8", shape=[2], contents=[1, 2]).SerializeToString() + b"\x0a\x01n"
    assert pb2.ModelInferRequest.FromString(twice).model_name == "n"
    assert list(parse(twice)) == [400, "the request's model_name is 'n', not 'm'"]


@pytest.mark.parametrize("bytes_, why", [
    (b"\x0a\x05ab", "a length past the end"),  # model_name claims 5 bytes, 2 follow
    (b"\x08" + b"\xff" * 11, "a varint longer than 10 bytes"),
    (b"\x0a\x02\xc3\x28", "not UTF-8"),  # model_name: an invalid UTF-8 sequence (protobuf's parsers refuse it too)
    (b"\x0f", "wire type 7"),
    (b"\x0c", "an end-group without its start"),
    (b"\x9b\x06" * 101 + b"\x9c\x06" * 101, "groups nested deeper than 100"),  # field 99 groups, as a hostile client nests them
    (b"\x9b\x06\x08\x01", "a group without its end"),
])
def test_malformed_grpc_messages_are_one_400_line_as_protobuf_refuses_them(bytes_, why):
    from google.protobuf.message import DecodeError
    from tritonclient.grpc import service_pb2 as pb2

    parse, _ = _message_codec("INT8", [2])
    with pytest.raises(DecodeError):
        pb2.ModelInferRequest.FromString(bytes_)  # protobuf refuses it too
    for status, line, *_ in (parse(bytes_), native.func("served_parse_message")(tvm_ffi.Array([]), bytes_)):
        assert status == 400 and "message protobuf can decode" in line and why in line and "\n" not in line, line


def test_grpc_messages_read_unknown_fields_unpacked_shapes_and_nested_groups_as_protobuf_does():
    from tritonclient.grpc import service_pb2 as pb2

    parse, _ = _message_codec("INT8", [2])
    message = pb2.ModelInferRequest(model_name="m", raw_input_contents=[b"\x05\x06"])
    message.inputs.add(name="x", datatype="INT8", shape=[2])
    extra = b"\x9b\x06" * 50 + b"\x9c\x06" * 50 + b"\xa0\x06\x07" + b"\xad\x06\x00\x00\x00\x00"  # groups, varint, fixed32
    unpacked = bytes(message.SerializeToString()) + extra
    assert pb2.ModelInferRequest.FromString(unpacked).raw_input_contents == [b"\x05\x06"]
    parsed = parse(unpacked)
    assert parsed[0] == 0 and np.from_dlpack(parsed[1]["x"]).tolist() == [5, 6], parsed
    # the shape as unpacked varints (field 3, wire type 0, once per dimension): proto3 parsers take both forms
    tensor = b"\x0a\x01x" + b"\x12\x04INT8" + b"\x18\x02"
    bytes_ = b"\x0a\x01m" + b"\x2a" + bytes([len(tensor)]) + tensor + b"\x3a\x02\x05\x06"
    assert list(pb2.ModelInferRequest.FromString(bytes_).inputs[0].shape) == [2]
    parsed = parse(bytes_)
    assert parsed[0] == 0 and np.from_dlpack(parsed[1]["x"]).tolist() == [5, 6], parsed
    # (its model read as protobuf reads it: no model of that name is served here)
    assert list(native.func("served_parse_message")(tvm_ffi.Array([]), bytes_)) == [
        404, "no model named 'm' is loaded (loaded: none)", -1]


def test_a_shape_claiming_more_than_the_body_holds_is_refused_before_anything_is_allocated():
    """A model that takes any rows (-1) and a client claiming 2^40 of them: each wire format refuses the request with
    one line naming the sizes (the tensor was allocated before the check: 3.4 PB, "out of host memory")."""
    from tritonclient.grpc import service_pb2 as pb2

    native.engine()
    parse, _, parse_message, _, parse_v1, _ = native.func("kserve_codec")("m", "1", [["x", "FP32", [-1, 784]]],
                                                                          [["y", "FP32", [-1, 784]]])
    rows = 1 << 40
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 784], "data": [1.0]}]}).encode()
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 784],
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    message = pb2.ModelInferRequest(model_name="m")
    message.inputs.add(name="x", datatype="FP32", shape=[rows, 784]).contents.fp32_contents.extend([1.0])
    for (status, line), needs in ((parse(body, None), rows * 784), (parse(header + b"abcd", str(len(header))), rows * 784 * 4),
                                  (parse_message(message.SerializeToString()), rows * 784)):
        assert status == 400 and f"needs {needs}" in line and "memory" not in line, line
    ragged = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 784],
                                     "data": [[1.0] * 783]}]}).encode()
    status, line = parse(ragged, None)
    assert status == 400 and "has 783 elements in 'data'; its shape [1,784] needs 784" in line, line
    # /v1's shape is the nesting of its first elements: three lists of 1000 would claim 10^9 elements
    nested = b'{"inputs": {"x": [' + b",".join([b"[" + b",".join([b"[" + b",".join([b"0"] * 1000) + b"]"] + [b"[0]"] * 999)
                                               + b"]"] + [b"[[0]]"] * 999) + b"]}}"
    status, line = parse_v1(nested)
    assert status == 400 and "has 2998 elements in 'data'; its shape [1000,1000,1000] needs 1000000000" in line, line


def test_a_grpc_message_finds_its_served_model_wherever_protobuf_wrote_its_name(compiled):
    """served_parse_message (tvmsched serve's ModelInfer): the model named by the message's last model_name and its
    model_version, the fields in any order, then the request parsed by that model's codec; a refusal names the model
    where one was found (the server counts it in that model's statistics), else -1."""
    from tritonclient.grpc import service_pb2 as pb2

    from tvmsched.runtime import Runtime

    def message(name="mlp", version="3", shape=(1, 784)):
        m = pb2.ModelInferRequest(model_name=name, model_version=version, id="x",
                                  raw_input_contents=[np.ones(shape, np.float32).tobytes()])
        m.inputs.add(name="input", datatype="FP32", shape=list(shape))
        return m.SerializeToString()

    with Runtime("cpu") as rt:
        for name in ("mlp", "other"):
            rt.load(compiled.artifact("mlp"), name=name, warmup=False)
        books = tvm_ffi.Array([rt.served("other"), rt.served("mlp", version="3")])
        parse = native.func("served_parse_message")
        wire = message()
        # as tritonclient writes it, another field first, and model_name given twice (protobuf keeps the last)
        for each in (wire, b"\x1a\x01y" + wire, b"\x0a\x05other" + wire):
            parsed = parse(books, each)
            assert parsed[0] == 0 and parsed[1] == 1, parsed
            assert np.from_dlpack(parsed[2]["input"]).tolist() == np.ones((1, 784)).tolist() and parsed[4][0] == "x"
        assert list(parse(books, wire + b"\x0a\x05other")) == [404, "model 'other' has no version '3' (it has version 1)", -1]
        assert list(parse(books, message(version="9"))) == [404, "model 'mlp' has no version '9' (it has version 3)", -1]
        assert list(parse(books, message(name="nope\n"))) == [404, "no model named 'nope?' is loaded (loaded: mlp, other)", -1]
        status, line, index = parse(books, message(name="x" * 5000))  # (a client's name, cut in the line)
        assert (status, index) == (404, -1) and line == "no model named '" + "x" * 80 + "...' is loaded (loaded: mlp, other)"
        status, line, index = parse(books, message(shape=(1, 783)))
        assert (status, index) == (400, 1) and "input 'input'" in line and "784" in line, line
        assert list(native.func("served_find")(books, "other", "")) == [0, 0]
