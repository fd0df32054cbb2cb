"""The one error type of the service: a request answered with an error, and its status in both protocols."""

from __future__ import annotations

import reprlib

from tvmsched.errors import TvmschedError

# the gRPC status of each HTTP status the service answers with
GRPC_CODES = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 409: "FAILED_PRECONDITION", 500: "INTERNAL",
              503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


class ServeError(TvmschedError):
    """A request the service answers with an error: `status` is its HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(" ".join(str(message).split()))
        self.status = status


def quote(value) -> str:
    """A value from a client, quoted for an error line: at most about 80 characters, whatever was sent."""
    short = reprlib.Repr()  # nested lists to 3 levels, 8 items each
    short.maxlevel, short.maxlist, short.maxdict, short.maxstring, short.maxother = 3, 8, 4, 60, 60
    text = short.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
