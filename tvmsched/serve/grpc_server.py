"""The Open Inference Protocol (KServe v2) over gRPC: inference.GRPCInferenceService (proto/grpc_service.proto).

Errors end the call with the status GRPC_CODES gives for the HTTP status (INVALID_ARGUMENT, NOT_FOUND,
FAILED_PRECONDITION, UNAVAILABLE: queue full, DEADLINE_EXCEEDED: the request could not start within its timeout)
and one line. ModelInfer reads raw_input_contents (one entry per input, in order) or each input's typed contents,
and answers with raw_output_contents, as Triton does: the call's bytes are read and the answer's written by the engine's
codec (tvmsched/kserve.h), with the checks and lines of the REST route; the other methods go through protobuf's
Python messages.
"""

from __future__ import annotations

import asyncio
import time

import grpc
from google.protobuf.message import DecodeError

from tvmsched.errors import TvmschedError
from tvmsched.serve.grpc_stubs import stubs
from tvmsched.serve.errors import GRPC_CODES, ServeError
from tvmsched.serve.service import InferenceService

TYPE_NUMBERS = {"BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7, "INT32": 8,
                "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12}


SERVICE = "inference.GRPCInferenceService"


def add_service(server: grpc.aio.Server, service: InferenceService) -> None:
    """Serve `service` on `server`: each method of the proto's service, unary, as the generated
    add_GRPCInferenceServiceServicer_to_server registers them, except that requests arrive as bytes and are decoded by
    the handler (_decoded), so that a message protobuf cannot decode is INVALID_ARGUMENT with one line."""
    pb2, _, _ = stubs()
    servicer, handlers = Servicer(service), {}
    for method in pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
        assert not method.client_streaming and not method.server_streaming, method.name
        if method.name == "ModelInfer":  # bytes in and out: the engine's codec reads and writes the messages
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(servicer.ModelInfer)
            continue
        handlers[method.name] = grpc.unary_unary_rpc_method_handler(
            _decoded(getattr(servicer, method.name), getattr(pb2, method.input_type.name)),
            response_serializer=getattr(pb2, method.output_type.name).SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_registered_method_handlers(SERVICE, handlers)


def _decoded(method, request_type):
    """`method` taking the request's bytes: grpc's own decoding failure is UNKNOWN with a Python exception's name
    ('Unexpected <class DecodeError>'), for a message nested deeper than protobuf's recursion limit (100 levels of
    unknown groups, say) or truncated bytes."""
    async def handler(raw: bytes, context):
        try:
            request = request_type.FromString(raw)
        except DecodeError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a {request_type.DESCRIPTOR.full_name} "
                                "message protobuf can decode (malformed, truncated, or nested deeper than its limit)")
        return await method(request, context)
    return handler


async def _abort(context, err: Exception):
    status = getattr(err, "status", 400)
    await context.abort(getattr(grpc.StatusCode, GRPC_CODES.get(status, "INVALID_ARGUMENT")), " ".join(str(err).split()))


class Servicer:
    """GRPCInferenceService's methods over an InferenceService."""

    def __init__(self, service: InferenceService):
        self.service = service
        self.pb2, _, self.config_pb2 = stubs()

    async def ServerLive(self, request, context):
        return self.pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return self.pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        served = self.service.models.get(request.name)
        return self.pb2.ModelReadyResponse(ready=served is not None and request.version in ("", served.spec.version))

    async def ServerMetadata(self, request, context):
        return self.pb2.ServerMetadataResponse(**self.service.server_metadata())

    async def ModelMetadata(self, request, context):
        try:
            meta = self.service.model_metadata(self.service.get(request.name, request.version))
        except ServeError as err:
            await _abort(context, err)
        return metadata_response(meta)

    async def ModelConfig(self, request, context):
        try:
            config = self.service.model_config(self.service.get(request.name, request.version))
        except ServeError as err:
            await _abort(context, err)
        return config_response(config)

    async def ModelStatistics(self, request, context):
        try:
            stats = self.service.statistics(request.name, request.version)
        except ServeError as err:
            await _abort(context, err)
        pb2 = self.pb2
        duration = lambda d: pb2.StatisticDuration(count=d["count"], ns=d["ns"])
        return pb2.ModelStatisticsResponse(model_stats=[
            pb2.ModelStatistics(name=s["name"], version=s["version"], last_inference=s["last_inference"],
                                inference_count=s["inference_count"], execution_count=s["execution_count"],
                                inference_stats=pb2.InferStatistics(**{k: duration(v) for k, v in s["inference_stats"].items()}),
                                batch_stats=[pb2.InferBatchStatistics(batch_size=b["batch_size"],
                                                                      **{k: duration(v) for k, v in b.items() if k != "batch_size"})
                                             for b in s["batch_stats"]])
            for s in stats["model_stats"]])

    async def RepositoryIndex(self, request, context):
        index = self.pb2.RepositoryIndexResponse.ModelIndex
        rows = [r for r in self.service.index() if not request.ready or r["state"] == "READY"]
        return self.pb2.RepositoryIndexResponse(models=[index(**r) for r in rows])

    async def RepositoryModelLoad(self, request, context):
        await self._repository(self.service.load, context, request.model_name, list(request.parameters))
        return self.pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._repository(self.service.unload, context, request.model_name)
        return self.pb2.RepositoryModelUnloadResponse()

    @staticmethod
    async def _repository(action, context, *args) -> None:
        """Load or unload off the event loop; a refusal aborts the call with its code."""
        try:
            await asyncio.to_thread(action, *args)
        except ServeError as err:
            await _abort(context, err)

    async def ModelInfer(self, message: bytes, context) -> bytes:
        """A ModelInferRequest's bytes to a ModelInferResponse's, both through the engine's codec (as serve/http.py's
        infer route does with a REST body)."""
        try:
            return await answer_message(self.service, message, time.monotonic_ns())
        except TvmschedError as err:
            await _abort(context, err)


def metadata_response(meta: dict):
    """ModelMetadataResponse of a model's metadata (InferenceService.model_metadata's JSON)."""
    pb2, _, _ = stubs()
    tensor = pb2.ModelMetadataResponse.TensorMetadata
    return pb2.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                     inputs=[tensor(**t) for t in meta["inputs"]],
                                     outputs=[tensor(**t) for t in meta["outputs"]])


def config_response(config: dict):
    """ModelConfigResponse of Triton's model configuration (InferenceService.model_config's JSON)."""
    pb2, _, config_pb2 = stubs()
    number = lambda t: TYPE_NUMBERS.get(t["data_type"][len("TYPE_"):], 0)
    message = config_pb2.ModelConfig(
        name=config["name"], platform=config["platform"], backend=config["backend"],
        max_batch_size=config["max_batch_size"],
        input=[config_pb2.ModelInput(name=t["name"], data_type=number(t), dims=t["dims"]) for t in config["input"]],
        output=[config_pb2.ModelOutput(name=t["name"], data_type=number(t), dims=t["dims"]) for t in config["output"]])
    for key, value in config["parameters"].items():
        message.parameters[key].string_value = value["string_value"]
    for group in config["instance_group"]:
        message.instance_group.add(name=group["name"], count=group["count"], gpus=group.get("gpus", []),
                                   kind=config_pb2.ModelInstanceGroup.Kind.Value(group["kind"]))
    if "dynamic_batching" in config:
        message.dynamic_batching.max_queue_delay_microseconds = config["dynamic_batching"]["max_queue_delay_microseconds"]
        message.dynamic_batching.preferred_batch_size.extend(config["dynamic_batching"].get("preferred_batch_size", []))
        if policy := config["dynamic_batching"].get("default_queue_policy"):
            queue = message.dynamic_batching.default_queue_policy
            queue.timeout_action = config_pb2.ModelQueuePolicy.TimeoutAction.Value(policy["timeout_action"])
            queue.default_timeout_microseconds = policy["default_timeout_microseconds"]
            queue.allow_timeout_override = policy["allow_timeout_override"]
            queue.max_queue_size = policy["max_queue_size"]
    return pb2.ModelConfigResponse(config=message)


async def answer_message(service: InferenceService, message: bytes, received: int) -> bytes:
    """A ModelInferRequest's bytes to a ModelInferResponse's, both through the engine's codec (as serve/http.py's infer
    route does with a REST body), counted in its model's statistics; a refusal raises a ServeError (or the engine's
    TvmschedError) with its status. `received`: its arrival (time.monotonic_ns())."""
    served, parsed = service.parse_message(message)  # its model's, [0, inputs, parameters, pending] or [status, line]
    if served is None:
        raise ServeError(parsed[1], parsed[0])
    try:
        if parsed[0]:
            raise ServeError(parsed[1], parsed[0])
        future = service.submit(served, parsed[1], dict(parsed[2]) if len(parsed[2]) else None, engine_tensors=True)
    except TvmschedError:
        service.count_failure(served, received)
        raise
    outputs = await service.answer(served, future, received)
    answer = served.codec.encode_message(parsed[3], outputs)  # [0, bytes] or [status, line]
    if answer[0]:
        raise ServeError(answer[1], answer[0])
    return bytes(answer[1])  # (grpc takes exact bytes: "Expected bytes, got Bytes" for tvm-ffi's subclass)
