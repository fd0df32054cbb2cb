"""Device helpers: make TVM's CUDA runtime available where TVM did not load it itself."""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import sys
from pathlib import Path

from tvmsched.errors import TvmschedError

log = logging.getLogger(__name__)


def tvm_device(kind: str):
    """`tvm.device(kind, 0)`, loading the CUDA runtime sidecar first when needed."""
    import tvm

    if kind == "cuda":
        _ensure_cuda_runtime(tvm)
    device = tvm.device(kind, 0)
    if not device.exist:
        raise TvmschedError(f"no {kind} device is available on this machine")
    return device


def _ensure_cuda_runtime(tvm) -> None:
    """A runtime-only TVM (TVM_USE_RUNTIME_LIB=1) skips its CUDA sidecar; load it with its libcudart."""
    if tvm.runtime.enabled("cuda"):
        return
    sidecar = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    if not sidecar.exists():
        return
    for cudart in _cudart_candidates():
        try:
            ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)
            break
        except OSError:
            continue
    try:
        ctypes.CDLL(str(sidecar), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        log.warning("cannot load TVM's CUDA runtime %s: %s", sidecar, err)


def _cudart_candidates() -> list[str]:
    """libcudart.so.13 by soname, then from CUDA installs and NVIDIA's pip wheels."""
    patterns = [
        os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "lib*", "libcudart.so.13*"),
        "/usr/local/cuda*/lib*/libcudart.so.13*",
        *(os.path.join(p, "nvidia", "*", "lib", "libcudart.so.13*") for p in sys.path if p),
        *(os.path.join(p, "nvidia", "cuda_runtime", "lib", "libcudart.so.13*") for p in sys.path if p),
    ]
    return ["libcudart.so.13", *sorted({f for pattern in patterns for f in glob.glob(pattern)})]
