"""The gRPC stubs of proto/grpc_service.proto, generated when the package is built.

The build (CMakeLists.txt, build_support/grpc_stubs.py) runs grpcio-tools, pinned in pyproject's
[build-system].requires, and installs grpc_service_pb2.py and grpc_service_pb2_grpc.py into this package, so
grpcio-tools is not needed at run time and the generated code matches the run-time protobuf's range. Their messages live in protobuf's default
pool under Triton's names (package `inference`): a process should not import these stubs and tritonclient.grpc's
together.
"""

from __future__ import annotations

import functools

from tvmsched.errors import TvmschedError


@functools.cache
def stubs():
    """(pb2, pb2_grpc): the messages and the service's servicer base."""
    try:
        from tvmsched.serve import grpc_service_pb2 as pb2
        from tvmsched.serve import grpc_service_pb2_grpc as pb2_grpc
    except ModuleNotFoundError as err:
        if err.name not in ("tvmsched.serve.grpc_service_pb2", "tvmsched.serve.grpc_service_pb2_grpc"):
            raise
        raise TvmschedError("the gRPC stubs are not built (tvmsched.serve.grpc_service_pb2 missing): run `make setup` "
                            "or reinstall tvmsched (pip install .)") from None
    return pb2, pb2_grpc
