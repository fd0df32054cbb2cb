"""JSON that `tvmsched serve` writes itself: error bodies and the answers of routes other than the infer routes.

Request bodies of the infer routes (/v2 REST, /v1) are read, and their answers written, by the engine's codec
(tvmsched/kserve.h, runtime/native/src/kserve.cc), the one implementation the C++ server uses too. Its rules: a body
nests at most 64 levels; it is UTF-8 with Unicode strings; it is strict JSON (a bare NaN or Infinity is a 400 that
says how to send such values); NaN and infinities in JSON outputs are the strings "NaN", "Infinity", "-Infinity".
"""

from __future__ import annotations

import json


def dumps(value) -> bytes:
    """Compact JSON text; a non-finite float left in `value` is a bug (ValueError), never a bare NaN on the wire."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
