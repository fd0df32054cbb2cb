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

/v2 and /v1 infer bodies are parsed and answers encoded by the engine (tvmsched/kserve.h, through
tvmsched.engine.kserve_codec): the one implementation the C++ server uses too. JSON: request bodies nest at most 64
levels and are strict JSON (a bare NaN or Infinity is a 400); NaN and infinities in JSON outputs are the strings "NaN",
"Infinity", "-Infinity".
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import zlib

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native
from tvmsched.serve import jsonio, metrics
from tvmsched.serve.asgi import MAX_BODY_BYTES, AnswerHeaders, BodyLimit, extra_answer_headers, too_large
from tvmsched.serve.errors import ServeError
from tvmsched.serve.service import InferenceService

HEADER_LENGTH = "Inference-Header-Content-Length"


def create_app(service: InferenceService, *, max_body_bytes: int = MAX_BODY_BYTES) -> InferRoute:
    """The server's ASGI app: the infer route (InferRoute) in front of FastAPI's app, which answers the rest."""
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

    @app.post("/v2/repository/index")
    def repository_index() -> list:
        return service.index()

    @app.post("/v2/repository/models/{name}/load")
    async def repository_load(name: str, request: Request) -> dict:
        await asyncio.to_thread(service.load, name, _load_parameters(await request.body()))
        return {}

    @app.post("/v2/repository/models/{name}/unload")
    async def repository_unload(name: str) -> dict:
        await asyncio.to_thread(service.unload, name)
        return {}

    _add_v1(app, service)

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(metrics.exposition(service, gpus), media_type=CONTENT_TYPE_LATEST)

    return InferRoute(app, service, max_body_bytes)


def _load_parameters(body: bytes) -> list[str]:
    """The parameter names of a repository load request's body (none when it is empty): {"parameters": {...}}."""
    if not body.strip():
        return []
    try:
        request = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        raise ServeError(f"the load request's body is not JSON: {' '.join(str(err).split())}", 400) from None
    parameters = request.get("parameters", {}) if isinstance(request, dict) else None
    if not isinstance(parameters, dict):
        raise ServeError('the load request\'s body must be a JSON object, its "parameters" an object', 400)
    return list(parameters)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _model_ready(service: InferenceService):
    def model_ready(name: str, version: str = "") -> Response:
        try:
            service.get(name, version)
        except ServeError as err:
            return JSONResponse({"name": name, "ready": False, "error": str(err)}, status_code=err.status)
        return JSONResponse({"name": name, "ready": True})
    return model_ready


_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_READ_HEADERS = (b"content-length", b"content-encoding", b"inference-header-content-length", b"x-request-id")


class InferRoute:
    """ASGI: POST /v2/models/{m}[/versions/{v}]/infer, answered here, every other request passed on to `app` (FastAPI's
    app: its body-limit and answer-header middleware, its routing). In front of FastAPI's app, not one of its
    middleware, it does what those two do for the requests it answers itself (413 past `max_body_bytes`, X-Request-Id
    back, Connection: close while draining): FastAPI's own layers (its telemetry check, its error and body-limit
    middleware) and the two cost a request at concurrency 1 more than the engine's codec does
    (bench/results/serving.md). `state` is the app's (the draining server sets `draining` on it)."""

    def __init__(self, app, service: InferenceService, max_body_bytes: int):
        self.app, self.service, self.max_body_bytes = app, service, max_body_bytes
        self.state = getattr(app, "state", None)

    async def __call__(self, scope, receive, send):
        match = _INFER.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if match is None or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        headers = {}
        for key, value in scope["headers"]:
            if key in _READ_HEADERS:
                headers[key] = value
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await too_large(send, self.max_body_bytes)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:  # a chunked body past the limit
                return await too_large(send, self.max_body_bytes)
            if not message.get("more_body", False):
                break
        # counted from here, once the body is in (as the C++ server's handler and gRPC's are called with it, and as
        # Triton starts a request's clock once its HTTP frontend has read it)
        received = time.monotonic_ns()
        status, body, extra = await self.infer(match[1], match[2] or "", headers, b"".join(chunks), received)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/octet-stream" if extra else b"application/json"),
                                (b"content-length", b"%d" % len(body)), *extra,
                                *extra_answer_headers(self.state, headers.get(b"x-request-id"))]})
        await send({"type": "http.response.body", "body": body})

    async def infer(self, name: str, version: str, headers: dict, body: bytes, received: int):
        """(status, body, extra headers) of one infer request."""
        service = self.service
        try:
            served = service.get(name, version)
        except ServeError as err:
            return _error_body(err)
        parse, encode = served.codec.parse, served.codec.encode
        try:
            encoding = headers.get(b"content-encoding", b"identity").decode("latin-1").lower()
            if encoding in ("gzip", "deflate"):
                body = _decompress(body, encoding, self.max_body_bytes)
            elif encoding != "identity":
                raise ServeError(f"Content-Encoding {encoding} is not supported (gzip, deflate)")
            length = headers.get(b"inference-header-content-length")
            parsed = parse(body, None if length is None else length.decode("latin-1"))  # [0, inputs, parameters, pending]
            if parsed[0]:  # or a refusal: [status, line]
                raise ServeError(parsed[1], parsed[0])
            future = service.submit(served, parsed[1], dict(parsed[2]) if len(parsed[2]) else None, engine_tensors=True)
        except TvmschedError as err:
            service.count_failure(served, received)
            return _error_body(err)
        try:
            outputs = await service.answer(served, future, received)
        except TvmschedError as err:
            return _error_body(err)
        answer = encode(parsed[3], outputs)  # [0, body, header length or -1] or a refusal: [status, line]
        if answer[0]:
            return _error_body(ServeError(answer[1], answer[0]))
        length = answer[2]
        return 200, answer[1], [] if length < 0 else [(HEADER_LENGTH.encode(), b"%d" % length)]


def _error_body(err: Exception) -> tuple[int, bytes, list]:
    return getattr(err, "status", 400), jsonio.dumps({"error": " ".join(str(err).split())}), []


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


def _add_v1(app: FastAPI, service: InferenceService) -> None:
    """examples/server.py's contract: {"inputs": {name: nested list}} -> {"outputs": {name: nested list}}."""

    @app.get("/v1/models")
    def list_models() -> Response:  # (the engine's, as the C++ server answers it)
        books = [served.book for served in list(service.models.values())]
        return Response(str(native.func("served_v1_models")(books)), media_type="application/json")

    @app.post("/v1/models/{name}/infer")
    async def infer_v1(name: str, request: Request) -> Response:
        """Read and answered by the engine's codec, as the C++ server does (one /v1 implementation)."""
        body = await request.body()
        received = time.monotonic_ns()  # (the body in, as on /v2)
        served = service.models.get(name)
        if served is None:
            return JSONResponse({"detail": f"no model named {name!r}"}, status_code=404)
        try:
            parsed = served.codec.parse_v1(body)  # [0, inputs] or [status, line]
            if parsed[0]:
                raise ServeError(parsed[1], parsed[0])
            future = service.submit(served, parsed[1], engine_tensors=True)
        except TvmschedError as err:
            service.count_failure(served, received)
            return JSONResponse({"detail": " ".join(str(err).split())}, status_code=getattr(err, "status", 400))
        try:
            outputs = await service.answer(served, future, received)
        except TvmschedError as err:
            return JSONResponse({"detail": " ".join(str(err).split())}, status_code=400)
        answer = served.codec.encode_v1(outputs)  # [0, body] or [status, line]
        if answer[0]:
            return JSONResponse({"detail": " ".join(str(answer[1]).split())}, status_code=answer[0])
        return Response(bytes(answer[1]), media_type="application/json")

    @app.get("/v1/stats")
    def stats() -> Response:  # (the engine's, as the C++ server answers it)
        books = [served.book for served in list(service.models.values())]
        return Response(str(native.func("served_v1_stats")(books)), media_type="application/json")
