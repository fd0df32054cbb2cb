"""Generate tvmsched.serve's gRPC stubs at build time (run by CMakeLists.txt with the build environment's Python).

    python build_support/grpc_stubs.py PROTO OUT_DIR

writes OUT_DIR/grpc_service_pb2.py, OUT_DIR/grpc_service_pb2_grpc.py and OUT_DIR/model_config_pb2.py (Triton's model
configuration, which the service imports; it lives beside PROTO), and OUT_DIR/model_config.desc (its descriptor set:
config.pbtxt files are parsed in a pool of their own, apart from tritonclient's messages) with grpcio-tools (pinned in pyproject's
[build-system].requires so the generated code suits the run-time protobuf); the generated modules import each other
relatively, so all live in the tvmsched.serve package, and name it as their messages' module (so they pickle).
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
    config = proto.parent / "model_config.proto"
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        code = protoc.main(["protoc", f"-I{proto.parent}", f"-I{include}", f"--python_out={tmp}",
                            f"--grpc_python_out={tmp}", str(proto), str(config)])
        if code == 0:
            code = protoc.main(["protoc", f"-I{proto.parent}", f"--descriptor_set_out={tmp}/model_config.desc",
                                str(config)])
        if code != 0:
            print(f"error: grpcio-tools could not compile {proto} (exit {code})", file=sys.stderr)
            return 1
        stem = proto.stem
        # the absolute imports protoc writes become relative ones (the modules live in one package)
        for name, imported in ((f"{stem}_pb2_grpc.py", f"{stem}_pb2"), (f"{stem}_pb2.py", "model_config_pb2")):
            module = Path(tmp) / name
            text = module.read_text()
            absolute = f"import {imported} as "
            if absolute not in text:
                print(f"error: unexpected imports in {module.name}", file=sys.stderr)
                return 1
            module.write_text(text.replace(absolute, f"from . import {imported} as ", 1))
        # and the messages' module is the one they are imported as, so that they pickle (Ray Serve's gRPC proxy hands
        # requests to deployments in other processes): protoc names it after the file alone
        for module_name in (f"{stem}_pb2", "model_config_pb2"):
            module = Path(tmp) / f"{module_name}.py"
            text, named = module.read_text(), f"BuildTopDescriptorsAndMessages(DESCRIPTOR, '{module_name}', _globals)"
            if named not in text:
                print(f"error: unexpected module name in {module.name}", file=sys.stderr)
                return 1
            module.write_text(text.replace(named, named.replace(f"'{module_name}'", f"'tvmsched.serve.{module_name}'")))
        for name in (f"{stem}_pb2.py", f"{stem}_pb2_grpc.py", "model_config_pb2.py", "model_config.desc"):
            os.replace(Path(tmp) / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
