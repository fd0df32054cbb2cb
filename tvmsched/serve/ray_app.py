"""Scale-out on Ray Serve (issue 40, step 5; docs/scale-out.md): a model repository served by replicas on a Ray cluster,
each replica one tvmsched Runtime on its node's devices, tritonclient unchanged.

    tvmsched serve-ray --model-repository models/ [--replicas 2] [--max-models-per-replica 2] [--devices cuda:0]
        [--num-gpus 1] [--port 8000] [--grpc-port 8001] [--address auto]

One deployment, the **replicas**, each the application's ingress (FastAPI behind Ray Serve's HTTP proxy), so a
request takes one hop, proxy -> replica:
- The Open Inference Protocol's REST routes. With `--grpc-port`, Ray Serve's gRPC proxy serves
  inference.GRPCInferenceService (its servicer registered, GRPC_SERVICER) to tritonclient.grpc: the replica's methods
  of the RPCs' names answer it.
- The replicas' request router (ray_router.py, Ray Serve's request-router API) reads the model a request names (its
  URL path /v2/models/NAME/..., or the gRPC message's model name: tritonclient never sends the header Ray's own
  multiplexing keys on) and sends it to a replica that holds the model while one has room in its queue.
- Ray decides which models each replica holds, at most `max_num_models_per_replica` (`@serve.multiplexed`).
  - Ray loads a model through the replica's Runtime (InferenceService.load, from the repository) and unloads it
    when Ray evicts it (the held model's `__del__`). The Runtime's switcher only stages models within that set. A
    name the repository lacks is refused (404) before Ray is asked, which would evict a model first.
  - Each body is parsed and each answer encoded by the engine's codec, as `tvmsched serve` does (serve/http.py's
    InferRoute; grpc_server.answer_message).
- `check_health` fails when no device of the replica's Runtime is in service.
- `max_ongoing_requests` is the replica's queue cap (--max-queue).
- On scale-down Ray calls `__del__`, which drains the Runtime (Runtime.shutdown) within
  `graceful_shutdown_timeout_s`. A replica that dies (killed, its node lost) fails the requests it was running with
  Ray's proxy's 500 "Internal Server Error"; the others go to the replicas left.

Ray is an extra (`pip install tvmsched[ray]`); without it every entry here is one error line naming it.
"""


import asyncio
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request, Response  # (no postponed annotations: Ray pickles the routes, FastAPI reads them)
from fastapi.responses import JSONResponse

from tvmsched.errors import TvmschedError

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
    """The replicas' deployment, the application's ingress: `replica_class` behind Ray's proxies."""
    _, serve = _ray()
    from ray.serve.config import RequestRouterConfig

    cls, app = replica_class(settings)
    return serve.deployment(num_replicas=settings.replicas, max_ongoing_requests=settings.max_queue,
                            request_router_config=RequestRouterConfig(request_router_class=ROUTER),
                            graceful_shutdown_timeout_s=settings.graceful_shutdown_timeout_s,
                            ray_actor_options={"num_cpus": settings.num_cpus, "num_gpus": settings.num_gpus},
                            )(serve.ingress(app)(cls))


def replica_class(settings: RaySettings):
    """(the replica's class, its FastAPI app): one tvmsched Runtime and its InferenceService over the repository."""
    _, serve = _ray()
    app = FastAPI(title="tvmsched on Ray Serve (Open Inference Protocol v2)")

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

        async def _held(self, name: str):
            """None once the model is held here (loaded by Ray's multiplexing if need be), else (status, one line). A
            name the repository lacks is refused before Ray's multiplexing is asked, which would evict a model first."""
            from tvmsched.serve.errors import ServeError

            try:
                if name not in self.service.models:
                    try:
                        self.service.repository.spec(name)
                    except LookupError as err:
                        raise ServeError(str(err), 404) from None
                await self.model(name)
            except (ServeError, TvmschedError) as err:  # (no such model in the repository: 404)
                return getattr(err, "status", 400), " ".join(str(err).split())
            return None

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

        async def describe(self, name: str, version: str, what: str) -> tuple[int, dict]:
            """(status, JSON) of a model's metadata, config or readiness."""
            from tvmsched.serve.errors import ServeError

            refused = await self._held(name)
            if refused:
                return refused[0], {"error": refused[1]}
            try:
                served = self.service.get(name, version)
            except ServeError as err:
                return err.status, {"error": " ".join(str(err).split())}
            if what == "config":
                return 200, self.service.model_config(served)
            return 200, self.service.model_metadata(served)

        async def _describe(self, name: str, version: str, what: str) -> Response:
            status, body = await self.describe(name, version, what)
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
            from tvmsched.serve import jsonio

            self.requests += 1
            headers = {key: value for key, value in request.headers.raw if key in _FORWARDED}
            body = await request.body()
            refused = await self._held(name)
            if refused:
                status, answer, extra = refused[0], jsonio.dumps({"error": refused[1]}), []
            else:
                status, answer, extra = await self.route.infer(name, version, headers, body, time.monotonic_ns())
            return Response(answer, status_code=status, headers={k.decode(): v.decode() for k, v in extra},
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
            status, _ = await self.describe(request.name, request.version, "ready")
            return _pb2().ModelReadyResponse(ready=status == 200)

        async def ModelMetadata(self, request, grpc_context):
            from tvmsched.serve.grpc_server import metadata_response

            status, body = await self.describe(request.name, request.version, "metadata")
            if status != 200:
                return _refused(grpc_context, status, body["error"], _pb2().ModelMetadataResponse())
            return metadata_response(body)

        async def ModelConfig(self, request, grpc_context):
            from tvmsched.serve.grpc_server import config_response

            status, body = await self.describe(request.name, request.version, "config")
            if status != 200:
                return _refused(grpc_context, status, body["error"], _pb2().ModelConfigResponse())
            return config_response(body)

        async def ModelInfer(self, request, grpc_context):
            """Read and answered by the engine's codec, as `tvmsched serve`'s gRPC server does."""
            from tvmsched.serve.errors import ServeError
            from tvmsched.serve.grpc_server import answer_message

            self.requests += 1
            refused = await self._held(request.model_name)
            if refused:
                return _refused(grpc_context, *refused, _pb2().ModelInferResponse())
            try:
                answer = await answer_message(self.service, request.SerializeToString(), time.monotonic_ns())
            except (ServeError, TvmschedError) as err:
                return _refused(grpc_context, getattr(err, "status", 400), " ".join(str(err).split()),
                                _pb2().ModelInferResponse())
            return _pb2().ModelInferResponse.FromString(answer)

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

    return TvmschedReplica, app


def build_app(settings: RaySettings):
    """The Ray Serve application: the replicas, each its own ingress, for `serve.run`."""
    _ray()
    if settings.replicas < 1 or settings.max_models_per_replica < 1 or settings.max_queue < 1:
        raise TvmschedError("replicas, max models per replica and the queue cap must each be at least 1")
    return replica_deployment(settings).bind()


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
