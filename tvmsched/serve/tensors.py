"""Tensors as the v2 protocol describes them: datatypes, a model's inputs and outputs, and request data to arrays."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tvmsched.serve.errors import ServeError, quote
from tvmsched.serve.jsonio import NON_FINITE

DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
             "FP16": "float16", "FP32": "float32", "FP64": "float64"}
V2_TYPES = {np.dtype(v): k for k, v in DATATYPES.items()}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str  # v2 name: FP32, INT64, ...
    shape: tuple[int, ...]
    dtype: np.dtype

    @functools.cached_property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def tensor_infos(manifest, bindings) -> tuple[TensorInfo, ...]:
    """The tensors as clients see them: a model compiled for a batch takes and gives any rows up to its batch size,
    so their first dimension is -1 (Triton's metadata for a batching model)."""
    infos = []
    for b in bindings:
        spec = manifest.tensors[b.tensor]
        dtype = np.dtype(spec.dtype)
        shape = tuple(int(d) for d in spec.shape)
        if manifest.batch_size:
            shape = (-1, *shape[1:])
        infos.append(TensorInfo(b.name, V2_TYPES.get(dtype, str(dtype).upper()), shape, dtype))
    return tuple(infos)


def to_array(info: TensorInfo, data, shape) -> np.ndarray:
    """A JSON `data` list (flat row-major, or nested in any way, as Triton reads it) or gRPC typed contents as the
    input's array. Its elements must be of the datatype's JSON kind: true/false for BOOL, integers within the type's
    range for the integer types, numbers for FP32 and FP64 (and the strings "NaN", "Infinity", "-Infinity", as
    JSON outputs carry non-finite values: serve/jsonio.py); anything else is a 400 naming the first wrong element."""
    values, kinds = _flatten(data)
    count = int(np.prod(info.shape))
    if len(values) != count:
        raise ServeError(f"input {info.name!r}: {len(values)} values for shape {list(info.shape)} ({count} expected)")
    if info.dtype.kind == "f" and str in kinds:
        values = [NON_FINITE.get(v, v) if type(v) is str else v for v in values]
        kinds = set(map(type, values))
    if not kinds <= _KINDS.get(info.dtype.kind, set()):
        allowed = _KINDS.get(info.dtype.kind, set())
        _refuse(info, next(v for v in values if type(v) not in allowed))
    try:
        with np.errstate(over="ignore"):  # 1e39 as FP32 is inf, as in C++
            array = np.asarray(values, dtype=info.dtype)
    except OverflowError:  # an integer out of the type's range
        limits = np.iinfo(info.dtype)
        _refuse(info, next(v for v in values if not limits.min <= v <= limits.max))
    return array.reshape(info.shape)


_KINDS = {"b": {bool}, "i": {int}, "u": {int}, "f": {int, float}}  # Python types of JSON elements per numpy kind


def _flatten(data) -> tuple[list, set]:
    """The elements of nested lists in depth-first order (a scalar: itself), and the set of their types."""
    if not isinstance(data, list):
        return [data], {type(data)}
    kinds = set(map(type, data))
    if list not in kinds:
        return data, kinds
    values, stack = [], [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            values.append(item)
        else:
            stack.pop()
    return values, set(map(type, values))


def _refuse(info: TensorInfo, value) -> None:
    raise ServeError(f"input {info.name!r} holds {quote(value)}, which is not a {info.datatype} value")


def from_bytes(info: TensorInfo, raw: bytes | memoryview) -> np.ndarray:
    """Raw little-endian row-major bytes as the input's array."""
    expected = info.nbytes
    if len(raw) != expected:
        raise ServeError(f"input {info.name!r}: {len(raw)} bytes of data for shape {list(info.shape)} {info.datatype} "
                         f"({expected} expected)")
    return np.frombuffer(raw, dtype=info.dtype).reshape(info.shape).copy()  # writable: the engine takes no read-only array
