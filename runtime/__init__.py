"""The tvmsched runtime: load artifacts and run their layers on CPU or CUDA."""

from tvmsched.runtime.executor import Executor


def load(path, device: str | None = None) -> Executor:
    """Load an artifact file into an executor on `device` (default: the artifact's own)."""
    return Executor(path, device)


__all__ = ["Executor", "load"]
