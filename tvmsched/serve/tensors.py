"""Tensors as the v2 protocol describes them: datatypes, and a model's inputs and outputs (requests are read by the
engine's codec, tvmsched/kserve.h)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
