"""The tvmsched runtime: load artifacts and run their layers on CPU or CUDA."""

from tvmsched.runtime.executor import Executor
from tvmsched.runtime.runtime import Runtime


def load(path, device: str | None = None) -> Executor:
    """Load an artifact file into an executor on `device` (default: the artifact's own)."""
    return Executor(path, device)


__all__ = ["Executor", "Runtime", "load"]
