"""The native engine (runtime/native, C++ on tvm-ffi): where it is built, and loading it into Python.

    python -m tvmsched.native --cmakedir      # for a C++ build: find_package(tvmsched) -> tvmsched::engine
    python -m tvmsched.native --includedir | --libdir | --lib

Python reaches the engine's objects (tvmsched.Model, tvmsched.Stream, tvmsched.Request) and functions
(tvmsched.engine.*) through tvm-ffi's own registration; `engine()` loads the library once.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import importlib.util
import os
import threading
from pathlib import Path

import tvm_ffi

from tvmsched.errors import TvmschedError

PACKAGE_DIR = Path(__file__).resolve().parent  # lib/, include/, cmake/: the engine as `make setup` installs it
LIB_NAME = "libtvmsched_engine.so"
_lock = threading.Lock()
_loaded = False


def library_path() -> Path:
    """The engine library: $TVMSCHED_ENGINE_LIB, else tvmsched/lib/ (where `make setup` puts it)."""
    env = os.environ.get("TVMSCHED_ENGINE_LIB")
    return Path(env) if env else PACKAGE_DIR / "lib" / LIB_NAME


def tvm_libdir() -> str:
    """TVM's runtime libraries (libtvm_runtime.so, which the kernel libraries call into)."""
    spec = importlib.util.find_spec("tvm")
    if spec is None or spec.origin is None:
        raise TvmschedError("TVM is not installed (pip install apache-tvm)")
    return str(Path(spec.origin).parent / "lib")


class NativeModel(tvm_ffi.Object):
    """A loaded artifact (C++ ModelObj): methods as registered in runtime/native/src/registry.cc."""


class NativeStream(tvm_ffi.Object):
    """One tenant's request stream (C++ StreamObj)."""


class NativeRequest(tvm_ffi.Object):
    """One queued request (C++ RequestObj)."""


tvm_ffi.register_error("TvmschedError", TvmschedError)


def _register_types() -> None:
    """Bind the engine's object types to the classes above (after the library registered them)."""
    for key, cls in (("tvmsched.Model", NativeModel), ("tvmsched.Stream", NativeStream), ("tvmsched.Request", NativeRequest)):
        tvm_ffi.register_object(key)(cls)


def engine():
    """Load the engine library once; returns the `tvm_ffi` module for calling its global functions."""
    global _loaded
    with _lock:
        if not _loaded:
            path = library_path()
            if not path.is_file():
                raise TvmschedError(f"the native engine is not built ({path} missing): run `make setup`")
            ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
            tvm_ffi.get_global_func("tvmsched.engine.set_tvm_libdir")(tvm_libdir())
            _register_types()
            _loaded = True
    return tvm_ffi


@functools.cache  # looked up once: some are called per request
def func(name: str):
    """A global function of the engine (`tvmsched.engine.<name>`)."""
    engine()
    return tvm_ffi.get_global_func(f"tvmsched.engine.{name}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tvmsched.native", description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--cmakedir", action="store_true", help="folder of tvmsched-config.cmake")
    group.add_argument("--includedir", action="store_true", help="folder of the public headers (tvmsched/engine.h)")
    group.add_argument("--libdir", action="store_true", help="folder of libtvmsched_engine.so")
    group.add_argument("--lib", action="store_true", help="the engine library itself")
    args = parser.parse_args()
    if args.cmakedir:
        print(PACKAGE_DIR / "cmake")
    elif args.includedir:
        print(PACKAGE_DIR / "include")
    elif args.libdir:
        print(library_path().parent)
    else:
        print(library_path())


if __name__ == "__main__":
    main()
