"""Compile CUDA kernels to a real fatbin on a machine without a GPU driver.

TVM loads its CUDA runtime only when `libcuda.so.1` is present; without it, `tvm.compile` keeps
the device code as CUDA source. A stand-in `libcuda.so.1` (every call answers "no device"),
loaded before TVM, lets TVM call nvcc at build time so the artifact carries a fatbin.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

_STUB_SOURCE = r"""
typedef int CUresult;
#define NODEV 100
CUresult cuGetErrorName(CUresult e, const char **s) { (void)e; if (s) *s = "CUDA_ERROR_NO_DEVICE"; return 0; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; if (s) *s = "no device (tvmsched libcuda stub)"; return 0; }
CUresult cuDeviceGetName(char *n, int len, int dev) { (void)n; (void)len; (void)dev; return NODEV; }
CUresult cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return NODEV; }
CUresult cuLaunchKernelEx(const void *c, void *f, void **p, void **e) { (void)c; (void)f; (void)p; (void)e; return NODEV; }
CUresult cuModuleGetFunction(void **f, void *m, const char *n) { (void)f; (void)m; (void)n; return NODEV; }
CUresult cuModuleLoadData(void **m, const void *img) { (void)m; (void)img; return NODEV; }
CUresult cuModuleUnload(void *m) { (void)m; return NODEV; }
CUresult cuTensorMapEncodeTiled(void *a, ...) { (void)a; return NODEV; }
CUresult cuInit(unsigned int f) { (void)f; return NODEV; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 0; return NODEV; }
CUresult cuGetProcAddress_v2(const char *s, void **p, int v, unsigned long long f, void *st)
{ (void)s; (void)p; (void)v; (void)f; (void)st; return NODEV; }
"""


def prepare_cuda_build(cache_dir: Path | None = None) -> None:
    """Make this process build CUDA kernels with nvcc; call before the first `import tvm`.

    Does nothing to the driver when a real `libcuda.so.1` exists or TVM is already loaded.
    """
    if shutil.which("nvcc"):
        os.environ.setdefault("TVM_CUDA_COMPILE_MODE", "nvcc")
    if "tvm" in sys.modules or ctypes.util.find_library("cuda") or not shutil.which("cc"):
        return
    cache_dir = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tvmsched"
    stub = cache_dir / "libcuda-stub" / "libcuda.so.1"
    if not stub.exists():
        stub.parent.mkdir(parents=True, exist_ok=True)
        source = stub.with_suffix(".c")
        source.write_text(_STUB_SOURCE)
        cmd = ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(source)]
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            log.warning("could not build the libcuda stub; CUDA kernels stay source")
            return
    ctypes.CDLL(str(stub), mode=ctypes.RTLD_GLOBAL)
    log.info("loaded the libcuda stub %s so nvcc builds a fatbin", stub)
