"""The one exception type for user errors: the CLI prints its message as one line and exits 2."""


class TvmschedError(Exception):
    """A problem with the user's input (model, artifact, options), stated in one line."""


def one_line(err: BaseException) -> str:
    """The last non-empty line of an exception's message (TVM puts the reason there)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
