"""JSON as both HTTP servers read and write it, for the routes the engine's codec does not serve (/v1, repository
control): /v2 infer bodies are read and answered by tvmsched/kserve.h (runtime/native/src/kserve.cc) under the same
rules.

Reading a request body:
- Its brackets may nest at most MAX_DEPTH (64) levels: deeper is one 400 line, found by a scan without recursion
  before any parser sees the body (Python's parser raised RecursionError on 100000 '[', answered 500; nlohmann's
  would overflow the C++ server's stack). 64 levels leave a tensor 60 nested dimensions inside a request.
- It is UTF-8 (a BOM is skipped) and its strings are Unicode (no "\\ud800" escape without its pair), as Triton and the
  C++ server read it.
- It is strict JSON: the bare literals NaN, Infinity and -Infinity (Python's json module reads them; Triton does
  too, rapidjson's kParseNanAndInfFlag, and tritonclient.http writes them for non-finite elements of JSON inputs)
  are a 400 that says how to send such values: as the strings below, or as binary data.

Writing JSON-encoded outputs: JSON has no NaN or infinity, so an element that is one is written as the string "NaN",
"Infinity" or "-Infinity": the spelling of Triton's bare literals, quoted. Strict JSON parsers read the answer, and
tritonclient's InferResult.as_numpy gives back the same float (it builds the array with numpy, which parses those
strings). Requests may send the strings back as elements of FP32 and FP64 inputs. Binary outputs (the
binary_tensor_data extension) carry non-finite values as they are.
"""

from __future__ import annotations

import json
import re

import numpy as np

from tvmsched.serve.errors import ServeError

MAX_DEPTH = 64
NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}  # strings in JSON data

# a string, as the depth scan of the C++ engine reads one (tvmsched::CheckJsonDepth): from a quote to the next quote
# not escaped by a backslash, or to the end of the text
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_CHUNK = 1 << 20


def check_depth(body: bytes, what: str) -> None:
    """Refuse (400) a JSON text whose brackets nest deeper than MAX_DEPTH outside strings, without parsing it."""
    if body.count(b"[") + body.count(b"{") <= MAX_DEPTH:  # the common case: no need to look closer
        return
    brackets = np.frombuffer(_STRING.sub(b"", body).translate(None, _NOT_BRACKETS), np.uint8)
    depth = 0
    for start in range(0, len(brackets), _CHUNK):  # in chunks: a 16 MiB body of brackets stays a few MiB of arrays
        chunk = brackets[start:start + _CHUNK]
        opened = np.cumsum((chunk == ord("[")) | (chunk == ord("{")), dtype=np.int64)
        levels = 2 * opened - np.arange(1, len(chunk) + 1)  # opened minus closed, after each bracket
        if depth + int(levels.max()) > MAX_DEPTH:
            raise ServeError(f"{what} nests deeper than {MAX_DEPTH} levels")
        depth += int(levels[-1])


def loads(body: bytes, what: str = "the request"):
    """The JSON value of a request body (or of its JSON header), or one 400 line saying what is wrong with it."""
    check_depth(body, f"{what}'s JSON")
    try:
        value = _DECODER.decode(body.decode("utf-8-sig"))
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ServeError(f"{what} is not valid JSON: {err}") from None
    if _SURROGATE.search(body) and not _unicode(value):  # "\ud800" alone: Python reads it, nlohmann and UTF-8 do not
        raise ServeError(f"{what} is not valid JSON: a string holds a UTF-16 surrogate escape (\\uD800-\\uDFFF) "
                         "that is not half of a pair")
    return value


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unicode(value) -> bool:
    """Whether every string in `value` (keys too) is Unicode that UTF-8 can encode: no lone surrogate."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(value, dict):
        return all(_unicode(k) and _unicode(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_unicode(v) for v in value if isinstance(v, (str, list, dict)))
    return True


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number; {NON_FINITE_HINT}")


NON_FINITE_HINT = 'send non-finite values as the strings "NaN", "Infinity", "-Infinity", or as binary data'
_DECODER = json.JSONDecoder(parse_constant=_no_constant)  # made once (json.loads with a hook makes one per call)


def dumps(value) -> bytes:
    """Compact JSON text; a non-finite float left in `value` is a bug (ValueError), never a bare NaN on the wire."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _non_finite(value: float) -> str:
    return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"


def flat_data(array: np.ndarray) -> list:
    """An output's JSON `data`: its elements in row-major order, non-finite floats as strings."""
    values = array.ravel().tolist()
    if array.dtype.kind == "f":
        for i in np.flatnonzero(~np.isfinite(array.ravel())).tolist():
            values[i] = _non_finite(values[i])
    return values


def nested_data(array: np.ndarray):
    """array.tolist() (examples/server.py's /v1 answers), non-finite floats as strings."""
    if array.dtype.kind != "f" or np.isfinite(array).all():
        return array.tolist()
    values = array.astype(object)
    for index in zip(*np.nonzero(~np.isfinite(array))):
        values[index] = _non_finite(float(array[index]))
    return values.tolist()
