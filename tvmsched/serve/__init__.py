"""`tvmsched serve`: the runtime behind the Open Inference Protocol (KServe v2) over HTTP and gRPC.

service.py holds the models and the per-request rules (both protocols call it), tensors.py the v2 datatypes and
request data, errors.py ServeError and its statuses, http.py and grpc_server.py the protocols, metrics.py /metrics,
repository.py the --model specs and model repositories, server.py the process.
"""
