"""The one exception type for user errors: the CLI prints its message as one line and exits 2."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import traceback
from collections.abc import Iterator


class TvmschedError(Exception):
    """A problem with the user's input (model, artifact, options), stated in one line."""


def whole_number_from_env(name: str, default: int, low: int, high: int, unit: str) -> int:
    """The environment variable `name` as a whole number from `low` to `high` (`default` when unset or blank); any
    other value is a one-line TvmschedError naming the variable, the range and `unit`."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise TvmschedError(f"{name}={text!r} is not a whole number of {unit} from {low} to {high}")
    return int(text)


def printable(text: str) -> str:
    """`text` with every character that is not printable escaped (a newline as \\n, ESC as \\x1b): one
    line that cannot move a terminal's cursor, whatever a hostile artifact or model put in it."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def one_line(err: BaseException) -> str:
    """The last non-empty line of an exception's message (TVM puts the reason there)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


@contextlib.contextmanager
def native_stderr() -> Iterator[list[str]]:
    """Collect what native code (TVM's C++ logging) writes to file descriptor 2 while the block runs.

    Yields a list that receives the text when the block ends. TVM warns from destructors (an importer
    that failed mid-way leaves a BlockBuilder that warns when freed, possibly after our error line):
    callers free such objects inside the block and decide what of the text to show.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    captured: list[str] = []
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.append(tmp.read().decode(errors="replace"))


def exception_reason(err: BaseException) -> str:
    """One line for an importer failure: its message, or for a bare assert the failing source line."""
    message = one_line(err)
    if message != type(err).__name__:
        return message
    frames = traceback.extract_tb(err.__traceback__)
    line = frames[-1].line if frames else ""
    return f"{type(err).__name__} ({line})" if line else message
