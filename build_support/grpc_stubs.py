"""Generate tvmsched.serve's gRPC stubs at build time (run by CMakeLists.txt with the build environment's Python).

    python build_support/grpc_stubs.py PROTO OUT_DIR

writes OUT_DIR/grpc_service_pb2.py and OUT_DIR/grpc_service_pb2_grpc.py with grpcio-tools (pinned in pyproject's
[build-system].requires so the generated code suits the run-time protobuf); the service stub imports its messages
relatively, so both live in the tvmsched.serve package.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc

    proto, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).parent / "_proto"
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        code = protoc.main(["protoc", f"-I{proto.parent}", f"-I{include}", f"--python_out={tmp}",
                            f"--grpc_python_out={tmp}", str(proto)])
        if code != 0:
            print(f"error: grpcio-tools could not compile {proto} (exit {code})", file=sys.stderr)
            return 1
        stem = proto.stem
        service = Path(tmp) / f"{stem}_pb2_grpc.py"
        text = service.read_text()
        absolute = f"import {stem}_pb2 as "
        if absolute not in text:
            print(f"error: unexpected import in {service.name}", file=sys.stderr)
            return 1
        service.write_text(text.replace(absolute, f"from . import {stem}_pb2 as ", 1))
        for name in (f"{stem}_pb2.py", f"{stem}_pb2_grpc.py"):
            os.replace(Path(tmp) / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
