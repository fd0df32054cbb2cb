"""The gRPC stubs of proto/grpc_service.proto (and of the model_config.proto it imports), generated when the package is
built.

The build (CMakeLists.txt, build_support/grpc_stubs.py) runs grpcio-tools, pinned in pyproject's
[build-system].requires, and installs grpc_service_pb2.py, grpc_service_pb2_grpc.py and model_config_pb2.py into this
package, so
grpcio-tools is not needed at run time and the generated code matches the run-time protobuf's range. Their messages live in protobuf's default
pool under Triton's names (package `inference`): a process should not import these stubs and tritonclient.grpc's
together.
"""

from __future__ import annotations

import functools

from tvmsched.errors import TvmschedError


@functools.cache
def stubs():
    """(pb2, pb2_grpc, config_pb2): the service's messages, its servicer base, and Triton's model configuration."""
    try:
        from tvmsched.serve import grpc_service_pb2 as pb2
        from tvmsched.serve import grpc_service_pb2_grpc as pb2_grpc
        from tvmsched.serve import model_config_pb2 as config_pb2
    except ModuleNotFoundError as err:
        if not err.name.startswith("tvmsched.serve.") or not err.name.endswith(("_pb2", "_pb2_grpc")):
            raise
        raise TvmschedError(f"the gRPC stubs are not built ({err.name} missing): run `make setup` "
                            "or reinstall tvmsched (pip install .)") from None
    return pb2, pb2_grpc, config_pb2
