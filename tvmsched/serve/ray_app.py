"""Scale-out on Ray Serve (issue 40, step 5; docs/scale-out.md): a model repository served by replicas on a Ray cluster,
each replica one tvmsched Runtime on its node's devices, tritonclient unchanged.

    tvmsched serve-ray --model-repository models/ [--replicas 2] [--max-models-per-replica 2] [--devices cuda:0]
        [--num-gpus 1] [--port 8000] [--grpc-port 8001] [--address auto]

Two deployments:
- the **ingress** (FastAPI behind Ray Serve's HTTP proxy) answers the Open Inference Protocol's REST routes. An infer
  request's model comes from its URL path (/v2/models/NAME/infer); the ingress passes the raw body to a replica
  through the replicas' handle with `multiplexed_model_id=NAME`. tritonclient never sends the header that Ray's own
  multiplexing keys on, so the ingress sets the id. The replicas' request router (ray_router.py, Ray Serve's
  request-router API) sends it to a replica that holds the model while one has room in its queue.
  A request whose replica died is sent once more.
  With `--grpc-port`, Ray Serve's gRPC proxy serves inference.GRPCInferenceService (its servicer registered,
  GRPC_SERVICER) to tritonclient.grpc: the ingress's methods of the RPCs' names answer it, and a ModelInfer call's bytes
  go to a replica holding the model the same way, read and answered there by the engine's codec.
- the **replicas**: Ray decides which models each holds, at most `max_num_models_per_replica`
  (`@serve.multiplexed`).
  - Ray loads a model through the replica's Runtime (InferenceService.load, from the repository) and unloads it
    when Ray evicts it (the held model's `__del__`). The Runtime's switcher only stages models within that set.
  - Each body is parsed and each answer encoded by the engine's codec, as `tvmsched serve` does (serve/http.py's
    InferRoute).
  - `check_health` fails when no device of the replica's Runtime is in service.
  - `max_ongoing_requests` is the replica's queue cap (--max-queue).
  - On scale-down Ray calls `__del__`, which drains the Runtime (Runtime.shutdown) within
    `graceful_shutdown_timeout_s`.

Ray is an extra (`pip install tvmsched[ray]`); without it every entry here is one error line naming it.
"""


import asyncio
import logging
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response  # (no postponed annotations: Ray pickles the routes, FastAPI reads them)
from fastapi.responses import JSONResponse

from tvmsched.errors import TvmschedError

log = logging.getLogger("tvmsched.serve.ray")

ROUTER = "tvmsched.serve.ray_router:HolderFirstRouter"  # the replicas' request router (ray_router.py)
_FORWARDED = (b"content-encoding", b"inference-header-content-length", b"x-request-id")


def _ray():
    try:
        import ray
        from ray import serve
    except ImportError:
        raise TvmschedError("Ray Serve is not installed: pip install 'tvmsched[ray]' (the ray extra)") from None
    return ray, serve


@dataclass(frozen=True)
class RaySettings:
    repository: str
    replicas: int = 2
    max_models_per_replica: int = 2
    devices: tuple[str, ...] = ()  # each replica's Runtime (none: the node's CPU)
    num_gpus: float = 0.0  # Ray's GPUs per replica
    num_cpus: float = 1.0
    max_queue: int = 64  # each replica's queue cap: max_ongoing_requests
    policy: str = "colocation"
    graceful_shutdown_timeout_s: float = 60.0
    route_prefix: str = "/"


class _Held:
    """A model Ray's multiplexing holds on a replica: evicted (its `__del__`, called by Ray), it is unloaded from the
    replica's Runtime, its queued and running requests finished first."""

    def __init__(self, service, name: str):
        self.service, self.name = service, name

    def __del__(self):
        service, self.service = self.service, None
        if service is not None and not service.runtime.closed and self.name in service.models:
            service.unload(self.name)  # (a replica shutting down drained its Runtime first: nothing to unload)


def replica_deployment(settings: RaySettings):
    """The replicas' deployment (its class: `.func_or_class`)."""
    _, serve = _ray()

    from ray.serve.config import RequestRouterConfig

    @serve.deployment(num_replicas=settings.replicas, max_ongoing_requests=settings.max_queue,
                      request_router_config=RequestRouterConfig(request_router_class=ROUTER),
                      graceful_shutdown_timeout_s=settings.graceful_shutdown_timeout_s,
                      ray_actor_options={"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus})
    class TvmschedReplica:
        def __init__(self):
            from tvmsched.runtime import Runtime
            from tvmsched.serve.asgi import MAX_BODY_BYTES
            from tvmsched.serve.http import InferRoute
            from tvmsched.serve.repository import Repository
            from tvmsched.serve.service import InferenceService

            device = settings.devices[0].split(":")[0] if settings.devices else "cpu"
            self.runtime = Runtime(device, devices=settings.devices, policy=settings.policy)
            repository = Repository(settings.repository, settings.devices or (device,))
            self.service = InferenceService(self.runtime, max_queue=settings.max_queue, repository=repository)
            self.route = InferRoute(None, self.service, MAX_BODY_BYTES)
            self.loads = 0  # models loaded by Ray's multiplexing (each a request that found its model absent)
            self.requests = 0

        @serve.multiplexed(max_num_models_per_replica=settings.max_models_per_replica)
        async def model(self, name: str) -> _Held:
            await asyncio.to_thread(self.service.load, name)
            self.loads += 1
            return _Held(self.service, name)

        async def infer(self, name: str, version: str, headers: dict, body: bytes):
            from tvmsched.serve import jsonio
            from tvmsched.serve.errors import ServeError

            self.requests += 1
            try:
                await self.model(serve.get_multiplexed_model_id())
            except (ServeError, TvmschedError) as err:  # (no such model in the repository: 404, one line)
                return getattr(err, "status", 400), jsonio.dumps({"error": " ".join(str(err).split())}), []
            return await self.route.infer(name, version, headers, body, time.monotonic_ns())

        async def infer_message(self, name: str, message: bytes):
            """(0, ModelInferResponse bytes) or (HTTP status, one line) of a gRPC ModelInfer call's bytes, read and
            answered by the engine's codec as `tvmsched serve`'s gRPC server does."""
            from tvmsched.serve.errors import ServeError
            from tvmsched.serve.grpc_server import answer_message

            self.requests += 1
            try:
                await self.model(serve.get_multiplexed_model_id())
                return 0, await answer_message(self.service, message, time.monotonic_ns())
            except (ServeError, TvmschedError) as err:
                return getattr(err, "status", 400), " ".join(str(err).split())

        async def describe(self, name: str, version: str, what: str):
            """(status, JSON) of a model's metadata, config or readiness."""
            from tvmsched.serve.errors import ServeError

            try:
                await self.model(serve.get_multiplexed_model_id())
                served = self.service.get(name, version)
            except (ServeError, TvmschedError) as err:
                return getattr(err, "status", 400), {"error": " ".join(str(err).split())}
            if what == "config":
                return 200, self.service.model_config(served)
            return 200, self.service.model_metadata(served)

        def counts(self) -> dict:
            import ray

            return {"replica": ray.get_runtime_context().get_actor_id(), "loads": self.loads,
                    "requests": self.requests, "models": sorted(self.service.models)}

        def check_health(self):
            devices = self.runtime.devices()
            if all(d["lost"] for d in devices):
                raise RuntimeError(f"no device of this replica is in service ({', '.join(d['name'] for d in devices)})")

        def __del__(self):
            runtime = getattr(self, "runtime", None)
            if runtime is not None:
                self.runtime = None
                runtime.shutdown()  # what is queued finishes first

    return TvmschedReplica


def build_app(settings: RaySettings):
    """The Ray Serve application (ingress bound to the replicas), for `serve.run`."""
    _, serve = _ray()
    if settings.replicas < 1 or settings.max_models_per_replica < 1 or settings.max_queue < 1:
        raise TvmschedError("replicas, max models per replica and the queue cap must each be at least 1")
    app = FastAPI(title="tvmsched on Ray Serve (Open Inference Protocol v2)")

    @serve.deployment(max_ongoing_requests=max(settings.max_queue * settings.replicas, 100))
    @serve.ingress(app)
    class TvmschedIngress:
        def __init__(self, replicas):
            self.replicas = replicas

        async def _call(self, method: str, name: str, *args):
            """A replica's answer for model `name`; a replica that died under the request: once more, elsewhere."""
            from ray.exceptions import ActorDiedError, ActorUnavailableError

            for attempt in (1, 2):
                try:
                    handle = self.replicas.options(multiplexed_model_id=name)
                    return await getattr(handle, method).remote(name, *args)
                except (ActorDiedError, ActorUnavailableError):
                    if attempt == 2:
                        raise
                    log.warning("a replica died under a request of model %s: sent once more", name)

        @app.get("/v2/health/live")
        def live(self) -> dict:
            return {"live": True}

        @app.get("/v2/health/ready")
        def ready(self) -> dict:
            return {"ready": True}

        @app.get("/v2")
        def server(self) -> dict:
            from tvmsched.serve.service import EXTENSIONS, SERVER_VERSION

            return {"name": "tvmsched", "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

        async def _describe(self, name: str, version: str, what: str) -> Response:
            status, body = await self._call("describe", name, version, what)
            if what == "ready":
                return Response(status_code=200 if status == 200 else 400 if status == 400 else 404)
            return JSONResponse(body, status_code=status)

        @app.get("/v2/models/{name}")
        @app.get("/v2/models/{name}/versions/{version}")
        async def metadata(self, name: str, version: str = "") -> Response:
            return await self._describe(name, version, "metadata")

        @app.get("/v2/models/{name}/ready")
        @app.get("/v2/models/{name}/versions/{version}/ready")
        async def model_ready(self, name: str, version: str = "") -> Response:
            return await self._describe(name, version, "ready")

        @app.get("/v2/models/{name}/config")
        async def config(self, name: str) -> Response:
            return await self._describe(name, "", "config")

        @app.post("/v2/models/{name}/infer")
        @app.post("/v2/models/{name}/versions/{version}/infer")
        async def infer(self, name: str, request: Request, version: str = "") -> Response:
            headers = {key: value for key, value in request.headers.raw if key in _FORWARDED}
            status, body, extra = await self._call("infer", name, version, headers, await request.body())
            return Response(body, status_code=status, headers={k.decode(): v.decode() for k, v in extra},
                            media_type="application/octet-stream" if extra else "application/json")

        # the Open Inference Protocol over gRPC, through Ray Serve's gRPC proxy (run(grpc_port=)): each method of
        # inference.GRPCInferenceService that tritonclient.grpc calls, named as the proxy calls it
        def ServerLive(self, request):
            return _pb2().ServerLiveResponse(live=True)

        def ServerReady(self, request):
            return _pb2().ServerReadyResponse(ready=True)

        def ServerMetadata(self, request):
            from tvmsched.serve.service import EXTENSIONS, SERVER_VERSION

            return _pb2().ServerMetadataResponse(name="tvmsched", version=SERVER_VERSION, extensions=list(EXTENSIONS))

        async def ModelReady(self, request, grpc_context):
            status, _ = await self._call("describe", request.name, request.version, "ready")
            return _pb2().ModelReadyResponse(ready=status == 200)

        async def ModelMetadata(self, request, grpc_context):
            from tvmsched.serve.grpc_server import metadata_response

            status, body = await self._call("describe", request.name, request.version, "metadata")
            if status != 200:
                return _refused(grpc_context, status, body["error"], _pb2().ModelMetadataResponse())
            return metadata_response(body)

        async def ModelConfig(self, request, grpc_context):
            from tvmsched.serve.grpc_server import config_response

            status, body = await self._call("describe", request.name, request.version, "config")
            if status != 200:
                return _refused(grpc_context, status, body["error"], _pb2().ModelConfigResponse())
            return config_response(body)

        async def ModelInfer(self, request, grpc_context):
            status, answer = await self._call("infer_message", request.model_name, request.SerializeToString())
            if status:
                return _refused(grpc_context, status, answer, _pb2().ModelInferResponse())
            return _pb2().ModelInferResponse.FromString(answer)

    return TvmschedIngress.bind(replica_deployment(settings).bind())


GRPC_SERVICER = "tvmsched.serve.grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server"


def _pb2():
    from tvmsched.serve.grpc_stubs import stubs

    return stubs()[0]


def _refused(grpc_context, status: int, line: str, empty):
    """A gRPC call answered with the status of the HTTP one (errors.GRPC_CODES) and one line."""
    import grpc

    from tvmsched.serve.errors import GRPC_CODES

    grpc_context.set_code(getattr(grpc.StatusCode, GRPC_CODES.get(status, "INVALID_ARGUMENT")))
    grpc_context.set_details(line)
    return empty


def run(settings: RaySettings, *, address: str | None = None, port: int = 8000, host: str = "127.0.0.1",
        grpc_port: int | None = None, blocking: bool = True):
    """Start (or join, `address`) a Ray instance and serve the repository through Ray Serve's HTTP proxy on
    host:port and, with `grpc_port`, its gRPC proxy (inference.GRPCInferenceService); blocking: until interrupted."""
    ray, serve = _ray()
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    grpc = {"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER]} if grpc_port else None
    serve.start(http_options={"host": host, "port": port}, grpc_options=grpc)
    handle = serve.run(build_app(settings), name="tvmsched", route_prefix=settings.route_prefix, blocking=False)
    if blocking:
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            serve.shutdown()
    return handle
