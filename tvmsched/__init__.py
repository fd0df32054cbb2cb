"""tvmsched: a TVM-based compiler, tuning toolchain and runtime for sharing one device among DNN tenants."""

import importlib.machinery
import os
import sys

__version__ = "0.1.0"

# TVM's CPU thread pool starts with one thread unless this is set before TVM loads.
os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count() or 1))


class _TvmWithoutTorch:
    """Import tvm_ffi and tvm with torch hidden: wherever torch is installed, tvm_ffi imports it at its own import (a
    workaround of its for a symbol clash on Windows) and so does tvm.relax (for its PyTorch interop), which costs ~4 s
    per process and makes every tvmsched process load torch, while tvmsched passes numpy arrays only. torch imported
    before them is left alone (they see it), and torch imported later works as usual. (docs/tvm-pitfalls.md)"""

    PACKAGES = ("tvm_ffi", "tvm")

    def __init__(self) -> None:
        self.hiding = False
        self.pending = set(self.PACKAGES)

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            if self.hiding:
                raise ModuleNotFoundError(f"No module named {name!r} (hidden while TVM loads)", name=name)
            return None
        if name not in self.pending:
            return None
        self.pending.discard(name)
        if self.hiding:  # imported by the other one, torch hidden already
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_without_torch(module) -> None:
            self.hiding = True
            try:
                exec_module(module)
            finally:
                self.hiding = False
                if not self.pending and self in sys.meta_path:
                    sys.meta_path.remove(self)  # both loaded: later imports of torch are not ours to change

        spec.loader.exec_module = exec_without_torch
        return spec


if "torch" not in sys.modules and not any(name in sys.modules for name in _TvmWithoutTorch.PACKAGES):
    sys.meta_path.insert(0, _TvmWithoutTorch())
