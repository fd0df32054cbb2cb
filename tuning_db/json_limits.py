"""JSON text from outside (HTTP requests, files to import), parsed only when it is nested shallowly enough.

Python's ``json`` module recurses once per nesting level and raises RecursionError near
``sys.getrecursionlimit()`` (1000 by default, shared with the caller's own stack), so ``"[" * 100000``
would crash the parser instead of being refused. ``json_depth`` measures the nesting without recursion
(linear time, bounded memory), and ``loads`` refuses text nested deeper than ``MAX_JSON_DEPTH`` before
parsing it. No legitimate payload comes close: TVM's module JSON is a flat node table, MetaSchedule
traces and argument infos nest a handful of levels.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

MAX_JSON_DEPTH = 512  # well below the recursion limit, whatever the caller's stack depth

# A JSON string, or an unterminated one up to the end of the text. Possessive quantifiers and the optional
# closing quote make every match attempt succeed after one linear pass: no backtracking, no retries.
_STRING = re.compile(r'"[^"\\]*+(?:\\.[^"\\]*+)*+"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]++")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class JSONTooDeep(ValueError):
    """JSON text nested deeper than allowed."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nested deeper than {limit} levels")
        self.limit = limit


def json_depth(text: str) -> int:
    """How deeply arrays and objects nest in JSON ``text`` (brackets inside strings do not count).

    Exact for valid JSON; for malformed text an estimate that never undercounts the nesting a parser
    would descend into before finding the error.
    """
    openers = text.count("[") + text.count("{")
    if openers <= 1:
        return openers
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(0, max(accumulate(map(_STEP.__getitem__, brackets)), default=0))


def check_depth(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise JSONTooDeep if ``text`` nests deeper than ``limit`` (cheap when it has few brackets; bytes
    are decoded only then, UnicodeDecodeError if they are not JSON text)."""
    if isinstance(text, (bytes, bytearray)):
        if text.count(b"[") + text.count(b"{") <= limit:
            return
        text = bytes(text).decode(json.detect_encoding(text))
    if text.count("[") + text.count("{") > limit and json_depth(text) > limit:
        raise JSONTooDeep(limit)


def loads(text: str | bytes, limit: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads``, refusing text nested deeper than ``limit`` (JSONTooDeep) before parsing it.

    Raises:
        ValueError: not JSON (json.JSONDecodeError, UnicodeDecodeError) or nested too deeply (JSONTooDeep).
    """
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode(json.detect_encoding(text))
    check_depth(text, limit)
    try:
        return json.loads(text)
    except RecursionError:  # a caller already deep in its own stack
        raise JSONTooDeep(limit) from None
