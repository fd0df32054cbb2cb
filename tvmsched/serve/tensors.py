"""Tensors as the v2 protocol describes them: datatypes, a model's inputs and outputs, and request data to arrays."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tvmsched.serve.errors import ServeError

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

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def tensor_infos(manifest, bindings) -> tuple[TensorInfo, ...]:
    infos = []
    for b in bindings:
        spec = manifest.tensors[b.tensor]
        dtype = np.dtype(spec.dtype)
        infos.append(TensorInfo(b.name, V2_TYPES.get(dtype, str(dtype).upper()), tuple(int(d) for d in spec.shape), dtype))
    return tuple(infos)


def to_array(info: TensorInfo, data, shape) -> np.ndarray:
    """A JSON `data` list (flat row-major, or nested) as the input's array."""
    try:
        array = np.asarray(data, dtype=info.dtype)
    except (TypeError, ValueError, OverflowError):
        raise ServeError(f"input {info.name!r}: data is not a list of {info.datatype} values") from None
    if array.size != int(np.prod(info.shape)):
        raise ServeError(f"input {info.name!r}: {array.size} values for shape {list(info.shape)} "
                         f"({int(np.prod(info.shape))} expected)")
    return array.reshape(info.shape)


def from_bytes(info: TensorInfo, raw: bytes | memoryview) -> np.ndarray:
    """Raw little-endian row-major bytes as the input's array."""
    expected = int(np.prod(info.shape)) * info.dtype.itemsize
    if len(raw) != expected:
        raise ServeError(f"input {info.name!r}: {len(raw)} bytes of data for shape {list(info.shape)} {info.datatype} "
                         f"({expected} expected)")
    return np.frombuffer(raw, dtype=info.dtype).reshape(info.shape).copy()  # writable: the engine takes no read-only array
