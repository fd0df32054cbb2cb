"""The Open Inference Protocol (KServe v2) over HTTP/REST, with Triton's extensions, for `tvmsched serve`.

Routes (errors are {"error": "one line"} with the status of the ServeError: 400 bad request, 404 unknown model or
version, 409 already loaded, 503 queue full or not ready, 504 deadline; a body over --max-body-bytes gets 413):
  GET  /v2/health/live, /v2/health/ready, /v2 (server metadata and extensions)
  GET  /v2/models/{m}[/versions/{v}], .../ready, .../config (Triton's model configuration), .../stats
  GET  /v2/models/stats                         every model's statistics (Triton's JSON)
  POST /v2/models/{m}[/versions/{v}]/infer      JSON, or JSON + binary tensors (the binary_tensor_data extension)
  POST /v2/repository/index, /v2/repository/models/{m}/load, /v2/repository/models/{m}/unload
  POST /v1/models/{m}/infer, GET /v1/models, /v1/stats   examples/server.py's JSON contract
  GET  /metrics                                 Prometheus (serve/metrics.py)

Binary tensors: a request whose JSON header is followed by raw tensor bytes says the header's length in the
Inference-Header-Content-Length header; each binary input has parameters.binary_data_size and takes that many
bytes, in input order (little-endian, row-major). Outputs come back binary when the request asks it (per output
parameters.binary_data, or parameters.binary_data_output for all), with the answer's header length in
Inference-Header-Content-Length.

JSON (serve/jsonio.py, the C++ server's rules too): request bodies nest at most 64 levels and are strict JSON (a bare
NaN or Infinity is a 400); NaN and infinities in JSON outputs are the strings "NaN", "Infinity", "-Infinity".
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib

import numpy as np
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from tvmsched.errors import TvmschedError
from tvmsched.serve import jsonio, metrics
from tvmsched.serve.asgi import MAX_BODY_BYTES, AnswerHeaders, BodyLimit
from tvmsched.serve.errors import ServeError, quote
from tvmsched.serve.service import VERSION, InferenceService, Served
from tvmsched.serve.tensors import from_bytes, to_array

HEADER_LENGTH = "Inference-Header-Content-Length"


def create_app(service: InferenceService, *, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    app = FastAPI(title="tvmsched inference (Open Inference Protocol v2)")
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(AnswerHeaders)
    app.state.service = service
    gpus = metrics.GpuCollector()  # NVML started once; no GPU: no GPU metrics

    @app.exception_handler(ServeError)
    async def serve_error(_request, err: ServeError):
        return JSONResponse({"error": str(err)}, status_code=err.status)

    @app.exception_handler(TvmschedError)
    async def user_error(_request, err: TvmschedError):
        return JSONResponse({"error": " ".join(str(err).split())}, status_code=400)

    @app.get("/v2/health/live")
    def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready")
    def ready() -> Response:
        if getattr(app.state, "draining", False):
            return JSONResponse({"ready": False, "error": "the server is shutting down"}, status_code=503)
        return JSONResponse({"ready": True})

    @app.get("/v2")
    def server_metadata() -> dict:
        return service.server_metadata()

    @app.get("/v2/models/stats")
    def all_stats() -> dict:
        return service.statistics()

    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        app.add_api_route(prefix, lambda name, version="": service.model_metadata(service.get(name, version)))
        app.add_api_route(prefix + "/ready", _model_ready(service))
        app.add_api_route(prefix + "/config", lambda name, version="": service.model_config(service.get(name, version)))
        app.add_api_route(prefix + "/stats", lambda name, version="": service.statistics(name, version))
        app.add_route(prefix + "/infer", _infer_route(service, max_body_bytes), methods=["POST"])

    @app.post("/v2/repository/index")
    def repository_index() -> list:
        return service.index()

    @app.post("/v2/repository/models/{name}/load")
    async def repository_load(name: str) -> dict:
        await asyncio.to_thread(service.load, name)
        return {}

    @app.post("/v2/repository/models/{name}/unload")
    async def repository_unload(name: str) -> dict:
        await asyncio.to_thread(service.unload, name)
        return {}

    _add_v1(app, service)

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(metrics.exposition(service, gpus), media_type=CONTENT_TYPE_LATEST)

    return app


def _model_ready(service: InferenceService):
    def model_ready(name: str, version: str = "") -> Response:
        try:
            service.get(name, version)
        except ServeError as err:
            return JSONResponse({"name": name, "ready": False, "error": str(err)}, status_code=err.status)
        return JSONResponse({"name": name, "ready": True})
    return model_ready


def _infer_route(service: InferenceService, max_body_bytes: int):
    async def infer(request: Request) -> Response:
        received = time.perf_counter_ns()
        params = request.path_params
        try:
            served = service.get(params["name"], params.get("version", ""))
        except ServeError as err:
            return _error(err)
        body = await request.body()
        try:
            header, inputs, binary_outputs = _parse_request(service, served, request.headers, body, max_body_bytes)
            future = service.submit(served, inputs, header.get("parameters"))
        except TvmschedError as err:
            service.count_failure(served, received)
            return _error(err)
        try:
            outputs = await service.answer(served, future, received)
        except TvmschedError as err:
            return _error(err)
        return _answer(served, header, outputs, binary_outputs)
    return infer


def _error(err: Exception) -> Response:
    return JSONResponse({"error": " ".join(str(err).split())}, status_code=getattr(err, "status", 400))


def _parse_request(service: InferenceService, served: Served, headers, body: bytes, max_body_bytes: int):
    """(JSON header, inputs, {output name: binary?}) of one infer request."""
    encoding = headers.get("content-encoding", "identity").lower()
    if encoding in ("gzip", "deflate"):
        body = _decompress(body, encoding, max_body_bytes)
    elif encoding != "identity":
        raise ServeError(f"Content-Encoding {encoding} is not supported (gzip, deflate)")
    length = headers.get(HEADER_LENGTH)
    if length is None:
        json_part, binary = body, memoryview(b"")
    else:
        if not length.isdigit() or int(length) > len(body):
            raise ServeError(f"{HEADER_LENGTH} {length!r} is not a length within the {len(body)}-byte body")
        json_part, binary = body[:int(length)], memoryview(body)[int(length):]
    header = jsonio.loads(json_part)
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list):
        raise ServeError('the request must be a JSON object with an "inputs" list')
    if not isinstance(header.get("id", ""), str):
        raise ServeError(f"the request's \"id\" must be a string, not {quote(header['id'])}")
    parameters = _object(header, "the request")
    inputs, offset = {}, 0
    for tensor in header["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise ServeError('every input must be an object with a "name", "datatype", "shape" and "data"')
        info = service.check_input(served, tensor["name"], tensor.get("datatype"), tensor.get("shape"))
        if info.name in inputs:
            raise ServeError(f"input {info.name!r} is given twice")
        size = _object(tensor, f"input {info.name!r}").get("binary_data_size")
        if size is not None:
            if "data" in tensor:
                raise ServeError(f'input {info.name!r} has both "data" and parameters.binary_data_size')
            if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise ServeError(f"input {info.name!r}: binary_data_size {quote(size)} passes the end of the "
                                 f"{len(binary)} bytes of binary data")
            inputs[info.name] = from_bytes(info, binary[offset:offset + size])
            offset += size
        elif "data" in tensor:
            inputs[info.name] = to_array(info, tensor["data"], tensor.get("shape"))
        else:
            raise ServeError(f'input {info.name!r} has neither "data" nor parameters.binary_data_size')
    if offset != len(binary):
        raise ServeError(f"the request carries {len(binary)} bytes of binary data; its inputs' binary_data_size "
                         f"add up to {offset}")
    service.check_all_inputs(served, inputs)
    default_binary = _flag(parameters, "binary_data_output", False, "the request")
    requested = header.get("outputs")
    requested = [] if requested is None else requested
    if not isinstance(requested, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in requested):
        raise ServeError('"outputs" must be a list of objects with a "name"')
    names = service.output_names(served, [o["name"] for o in requested])
    binary_of = {}
    for output in requested:
        what = f"output {output['name']!r}"
        if output["name"] in binary_of:
            raise ServeError(f"{what} is requested twice")
        output_parameters = _object(output, what)
        if "classification" in output_parameters:
            raise ServeError(f"{what} asks for classification, which this server does not do")
        binary_of[output["name"]] = _flag(output_parameters, "binary_data", default_binary, what)
    return header, inputs, {name: binary_of.get(name, default_binary) for name in names}


def _decompress(body: bytes, encoding: str, max_body_bytes: int) -> bytes:
    """A gzip or deflate body, inflated to at most `max_body_bytes` (more: 413, as a body that large would be)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    try:
        inflated = inflater.decompress(body, max_body_bytes + 1)
    except zlib.error:
        raise ServeError(f"the request body is not valid {encoding} data") from None
    if len(inflated) > max_body_bytes:
        raise ServeError(f"the {encoding} request body inflates to more than {max_body_bytes} bytes", 413)
    if not inflater.eof:
        raise ServeError(f"the request body is not valid {encoding} data (it ends early)")
    return inflated


def _object(owner: dict, what: str) -> dict:
    """`owner`'s "parameters" object ({} when absent or null; 400 when it is something else)."""
    parameters = owner.get("parameters")
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise ServeError(f'{what}\'s "parameters" must be an object, not {quote(parameters)}')
    return parameters


def _flag(parameters: dict, key: str, default: bool, what: str) -> bool:
    value = parameters.get(key, default)
    if not isinstance(value, bool):
        raise ServeError(f"{what}'s parameter {key!r} must be true or false, not {quote(value)}")
    return value


def _answer(served: Served, header: dict, outputs: dict[str, np.ndarray], binary_outputs: dict[str, bool]) -> Response:
    described, chunks = [], []
    infos = {t.name: t for t in served.outputs}
    for name, binary in binary_outputs.items():
        array = np.ascontiguousarray(outputs[name])
        entry = {"name": name, "datatype": infos[name].datatype, "shape": list(array.shape)}
        if binary:
            chunk = array.tobytes()
            entry["parameters"] = {"binary_data_size": len(chunk)}
            chunks.append(chunk)
        else:
            entry["data"] = jsonio.flat_data(array)  # NaN and infinities as strings (jsonio)
        described.append(entry)
    answer = {"model_name": served.name, "model_version": VERSION, "outputs": described}
    if "id" in header:
        answer["id"] = header["id"]
    text = jsonio.dumps(answer)
    if not chunks:
        return Response(text, media_type="application/json")
    return Response(b"".join([text, *chunks]), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(text))})


def _add_v1(app: FastAPI, service: InferenceService) -> None:
    """examples/server.py's contract: {"inputs": {name: nested list}} -> {"outputs": {name: nested list}}."""

    @app.get("/v1/models")
    def list_models() -> dict:
        return {name: {"qos_ms": s.model.qos_ms, "priority": s.model.priority,
                       "inputs": {t.name: list(t.shape) for t in s.inputs}} for name, s in service.models.items()}

    @app.post("/v1/models/{name}/infer")
    async def infer_v1(name: str, request: Request) -> Response:
        received = time.perf_counter_ns()
        served = service.models.get(name)
        if served is None:
            return JSONResponse({"detail": f"no model named {name!r}"}, status_code=404)
        try:
            raw = await request.body()
            jsonio.check_depth(raw, "the body")
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("inputs"), dict):
                return JSONResponse({"detail": 'the body must be {"inputs": {name: values}}'}, status_code=422)
            dtypes = {t.name: t.dtype for t in served.inputs}
            inputs = {k: np.asarray(v, dtype=dtypes.get(k, "float32")) for k, v in body["inputs"].items()}
            future = service.submit(served, inputs)
        except (TvmschedError, ValueError, TypeError) as err:
            service.count_failure(served, received)
            return JSONResponse({"detail": " ".join(str(err).split())}, status_code=getattr(err, "status", 400))
        try:
            outputs = await service.answer(served, future, received)
        except TvmschedError as err:
            return JSONResponse({"detail": " ".join(str(err).split())}, status_code=400)
        return JSONResponse({"outputs": {k: jsonio.nested_data(v) for k, v in outputs.items()}})

    @app.get("/v1/stats")
    def stats() -> dict:
        return service.runtime.stats()
