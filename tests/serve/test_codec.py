"""The engine's Open Inference Protocol codec (runtime/native/src/kserve.cc), called as `tvmsched serve` calls it:
FP16 elements of JSON data against numpy's conversion, outputs nested or flat, and answers a strict parser reads."""

import json

import numpy as np
import pytest
import tvm_ffi

from tvmsched.runtime import native


def _codec(dtype: str, shape: list[int]):
    native.engine()
    return native.func("kserve_codec")("m", "1", [["x", dtype, shape]], [["y", dtype, shape]])


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
    ({"timeout": -5}, "parameter timeout must be a non-negative number of microseconds, not -5"),
    ({"timeout": "10"}, 'not "10"'), ({"timeout": False}, "not false"), ({"timeout": 2.5}, "not 2.5"),
])
def test_scheduling_parameters_of_another_kind_are_a_400_line(parameters, fragment):
    status, line = native.func("kserve_scheduling")(parameters)
    assert int(status) == 400 and fragment in str(line) and "\n" not in str(line)
