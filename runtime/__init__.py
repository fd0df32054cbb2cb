"""The tvmsched runtime: load artifacts and run their layers on CPU or CUDA.

`Executor` and `Runtime` import TVM and the engine on first use, so the subpackages that need neither
(collectives: agents, the controller, the aggregation service) start fast.
"""


def __getattr__(name: str):
    if name == "Executor":
        from tvmsched.runtime.executor import Executor
        return Executor
    if name == "Runtime":
        from tvmsched.runtime.runtime import Runtime
        return Runtime
    if name == "SplitExecutor":
        from tvmsched.runtime.executor import SplitExecutor
        return SplitExecutor
    raise AttributeError(f"module 'tvmsched.runtime' has no attribute {name!r}")


def load(path, device: str | None = None, trusted_keys=()):
    """Load an artifact file into an executor on `device` (default: the artifact's own); with
    `trusted_keys` (public key files), only if one of them signed it."""
    from tvmsched.runtime.executor import Executor
    return Executor(path, device, trusted_keys=trusted_keys)


__all__ = ["Executor", "Runtime", "SplitExecutor", "load"]
