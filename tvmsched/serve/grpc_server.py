"""The Open Inference Protocol (KServe v2) over gRPC: inference.GRPCInferenceService (proto/grpc_service.proto).

Errors end the call with the status GRPC_CODES gives for the HTTP status (INVALID_ARGUMENT, NOT_FOUND,
FAILED_PRECONDITION, UNAVAILABLE: queue full, DEADLINE_EXCEEDED: the request could not start within its timeout)
and one line. ModelInfer reads raw_input_contents (one entry per input, in order) or each input's typed contents,
and answers with raw_output_contents, as Triton does.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from tvmsched.errors import TvmschedError
from tvmsched.serve.grpc_stubs import stubs
from tvmsched.serve.errors import GRPC_CODES, ServeError
from tvmsched.serve.service import InferenceService
from tvmsched.serve.tensors import from_bytes, to_array

CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}
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


def _parameter(value):
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


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
        tensor = self.pb2.ModelMetadataResponse.TensorMetadata
        return self.pb2.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                                              inputs=[tensor(**t) for t in meta["inputs"]],
                                              outputs=[tensor(**t) for t in meta["outputs"]])

    async def ModelConfig(self, request, context):
        try:
            config = self.service.model_config(self.service.get(request.name, request.version))
        except ServeError as err:
            await _abort(context, err)
        pb2 = self.config_pb2
        number = lambda t: TYPE_NUMBERS.get(t["data_type"][len("TYPE_"):], 0)
        message = pb2.ModelConfig(
            name=config["name"], platform=config["platform"], backend=config["backend"],
            max_batch_size=config["max_batch_size"],
            input=[pb2.ModelInput(name=t["name"], data_type=number(t), dims=t["dims"]) for t in config["input"]],
            output=[pb2.ModelOutput(name=t["name"], data_type=number(t), dims=t["dims"]) for t in config["output"]])
        for key, value in config["parameters"].items():
            message.parameters[key].string_value = value["string_value"]
        for group in config["instance_group"]:
            message.instance_group.add(name=group["name"], count=group["count"], gpus=group.get("gpus", []),
                                       kind=pb2.ModelInstanceGroup.Kind.Value(group["kind"]))
        if "dynamic_batching" in config:
            message.dynamic_batching.max_queue_delay_microseconds = \
                config["dynamic_batching"]["max_queue_delay_microseconds"]
            message.dynamic_batching.preferred_batch_size.extend(
                config["dynamic_batching"].get("preferred_batch_size", []))
        return self.pb2.ModelConfigResponse(config=message)

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
        await self._repository(self.service.load, request.model_name, context)
        return self.pb2.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._repository(self.service.unload, request.model_name, context)
        return self.pb2.RepositoryModelUnloadResponse()

    @staticmethod
    async def _repository(action, name: str, context) -> None:
        """Load or unload off the event loop; a refusal aborts the call with its code."""
        try:
            await asyncio.to_thread(action, name)
        except ServeError as err:
            await _abort(context, err)

    async def ModelInfer(self, request, context):
        received = time.perf_counter_ns()
        service = self.service
        try:
            served = service.get(request.model_name, request.model_version)
        except ServeError as err:
            await _abort(context, err)
        try:
            inputs = self._inputs(served, request)
            names = service.output_names(served, [o.name for o in request.outputs])
            future = service.submit(served, inputs, {k: _parameter(v) for k, v in request.parameters.items()})
        except TvmschedError as err:
            service.count_failure(served, received)
            await _abort(context, err)
        try:
            outputs = await service.answer(served, future, received)
        except TvmschedError as err:
            await _abort(context, err)
        infos = {t.name: t for t in served.outputs}
        tensor = self.pb2.ModelInferResponse.InferOutputTensor
        arrays = [np.ascontiguousarray(outputs[n]) for n in names]
        return self.pb2.ModelInferResponse(
            model_name=served.name, model_version=served.spec.version, id=request.id,
            outputs=[tensor(name=n, datatype=infos[n].datatype, shape=a.shape) for n, a in zip(names, arrays)],
            raw_output_contents=[a.tobytes() for a in arrays])

    def _inputs(self, served, request) -> dict[str, np.ndarray]:
        raw = request.raw_input_contents
        if raw and len(raw) != len(request.inputs):
            raise ServeError(f"{len(raw)} raw_input_contents for {len(request.inputs)} inputs")
        inputs = {}
        for i, tensor in enumerate(request.inputs):
            info = self.service.check_input(served, tensor.name, tensor.datatype, tensor.shape)
            if info.name in inputs:
                raise ServeError(f"input {info.name!r} is given twice")
            if raw:
                inputs[info.name] = from_bytes(info, raw[i])
            elif info.datatype in CONTENTS:
                inputs[info.name] = to_array(info, list(getattr(tensor.contents, CONTENTS[info.datatype])), tensor.shape)
            else:
                raise ServeError(f"input {info.name!r}: {info.datatype} data must come in raw_input_contents")
        self.service.check_all_inputs(served, inputs)
        return inputs
