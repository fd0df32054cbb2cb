"""The v2 protocol's datatypes (a served model's inputs and outputs, and its requests, are the engine's:
tvmsched/serving.h, tvmsched/kserve.h)."""

from __future__ import annotations

import numpy as np

DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
             "FP16": "float16", "FP32": "float32", "FP64": "float64"}
V2_TYPES = {np.dtype(v): k for k, v in DATATYPES.items()}
