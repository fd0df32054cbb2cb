"""The gRPC stubs of proto/grpc_service.proto, generated with grpcio-tools on first use.

They are written once per proto text and generator versions into ~/.cache/tvmsched/grpc/<hash>/ (or
$TVMSCHED_GRPC_STUBS) and
imported from there, so the package ships only the .proto. Its messages live in protobuf's default pool under
Triton's names (package `inference`): a process should not import these stubs and tritonclient.grpc's together.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

from tvmsched.errors import TvmschedError

log = logging.getLogger(__name__)
PROTO = Path(__file__).resolve().parent / "proto" / "grpc_service.proto"


def stub_dir() -> Path:
    """One folder per proto text and generator: stubs made by another grpcio-tools / protobuf (another venv sharing
    the home folder) do not import under this one ("Descriptors cannot be created directly")."""
    from importlib.metadata import PackageNotFoundError, version

    root = os.environ.get("TVMSCHED_GRPC_STUBS") or Path.home() / ".cache" / "tvmsched" / "grpc"
    key = hashlib.sha256(PROTO.read_bytes())
    for package in ("grpcio-tools", "protobuf"):
        try:
            key.update(f"{package}={version(package)}".encode())
        except PackageNotFoundError:
            key.update(f"{package}=none".encode())
    return Path(root) / key.hexdigest()[:16]


@functools.cache
def stubs():
    """(pb2, pb2_grpc): the messages and the service's servicer base, generated if missing."""
    out = stub_dir()
    if not (out / "grpc_service_pb2_grpc.py").is_file():
        _generate(out)
    pb2 = _import("grpc_service_pb2", out)
    return pb2, _import("grpc_service_pb2_grpc", out)


def _generate(out: Path) -> None:
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    code = protoc.main(["protoc", f"-I{PROTO.parent}", f"-I{include}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                        str(PROTO)])
    if code != 0:
        raise TvmschedError(f"grpcio-tools could not compile {PROTO} (exit {code})")
    for name in ("grpc_service_pb2.py", "grpc_service_pb2_grpc.py"):  # pb2 first: the stub imports it
        os.replace(tmp / name, out / name)
    tmp.rmdir()
    log.info("generated the gRPC stubs in %s", out)


def _import(name: str, folder: Path):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the service stub imports its messages by this top-level name
    spec.loader.exec_module(module)
    return module
