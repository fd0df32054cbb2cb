"""The tvmsched runtime: load artifacts and run their layers on CPU or CUDA."""

from tvmsched.runtime.executor import Executor
from tvmsched.runtime.runtime import Runtime


def load(path, device: str | None = None, trusted_keys=()) -> Executor:
    """Load an artifact file into an executor on `device` (default: the artifact's own); with
    `trusted_keys` (public key files), only if one of them signed it."""
    return Executor(path, device, trusted_keys=trusted_keys)


__all__ = ["Executor", "Runtime", "load"]
