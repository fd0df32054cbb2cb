"""`tvmsched serve`: one Runtime, its models, the v2 protocol over HTTP and gRPC in one asyncio loop."""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

from tvmsched.errors import TvmschedError
from tvmsched.serve.asgi import MAX_BODY_BYTES, draining_server
from tvmsched.serve.repository import ModelSpec, Repository, check_artifact
from tvmsched.serve.service import InferenceService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8000  # HTTP
    grpc_port: int = 8001  # 0: no gRPC
    max_queue: int = 64  # per model: requests queued or running before 503
    max_body_bytes: int = MAX_BODY_BYTES


def build_service(specs: list[ModelSpec], repository: str | None, *, device: str = "cpu", memory_budget: int | None = None,
                  colocation: str | None = None, trusted_keys=(), max_queue: int = 64,
                  policy: str = "colocation", devices: tuple[str, ...] = ()) -> InferenceService:
    """A Runtime with the models of `specs` and of the repository loaded (and warmed up); what can be checked
    without loading (flags, the repository, the artifacts' paths) is checked first, before TVM is imported."""
    if not specs and repository is None:
        raise TvmschedError("nothing to serve: give --model NAME=PATH and/or --model-repository DIR")
    if max_queue < 1:
        raise TvmschedError("--max-queue must be at least 1")
    if devices:  # several devices (docs/multi-device.md): each model placed whole, or replicas per its config
        device = devices[0].split(":")[0]
    repo = Repository(repository, devices or (device,)) if repository is not None else None
    repo_specs = [repo.spec(name) for name in repo.names()] if repo else []
    names = [s.name for s in specs + repo_specs]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise TvmschedError(f"two models are named {duplicate!r}")
    for spec in specs + repo_specs:
        check_artifact(spec.path)
    from tvmsched.runtime import Runtime

    runtime = Runtime(device, policy=policy, colocation=colocation, trusted_keys=trusted_keys,
                      memory_budget=memory_budget, devices=devices)
    service = InferenceService(runtime, max_queue=max_queue, repository=repo)
    try:
        for spec in specs + repo_specs:
            service.add(spec)
    except BaseException:
        runtime.shutdown()
        raise
    return service


def check_ports(settings: ServerSettings) -> None:
    """Fail before loading anything if a port cannot be listened on."""
    for port in (settings.port, settings.grpc_port):
        if port == 0 and port == settings.grpc_port:
            continue
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((settings.host, port))
            except OSError as err:
                raise TvmschedError(f"cannot listen on {settings.host}:{port}: {err.strerror}") from None


def serve(service: InferenceService, settings: ServerSettings) -> None:
    """Serve until SIGTERM/SIGINT (drained: requests in flight answered), then shut the runtime down."""
    from uvicorn.loops.auto import auto_loop_factory

    try:  # uvloop's loop where it is installed, as uvicorn's loop="auto" (and its http="auto": httptools)
        with asyncio.Runner(loop_factory=auto_loop_factory()) as runner:
            runner.run(_serve(service, settings))
    finally:
        service.runtime.shutdown()


async def _serve(service: InferenceService, settings: ServerSettings) -> None:
    import grpc

    from tvmsched.serve.grpc_server import add_service
    from tvmsched.serve.http import create_app

    app = create_app(service, max_body_bytes=settings.max_body_bytes)
    grpc_server = None
    if settings.grpc_port:
        grpc_server = grpc.aio.server(options=[("grpc.max_receive_message_length", settings.max_body_bytes),
                                               ("grpc.max_send_message_length", settings.max_body_bytes)])
        add_service(grpc_server, service)
        if not grpc_server.add_insecure_port(f"{settings.host}:{settings.grpc_port}"):
            raise TvmschedError(f"cannot listen on {settings.host}:{settings.grpc_port} for gRPC")
        await grpc_server.start()
    http = draining_server(app, settings.host, settings.port)
    log.info("serving %s: HTTP on %s:%d, gRPC %s", ", ".join(service.models) or "no model yet", settings.host,
             settings.port, f"on port {settings.grpc_port}" if grpc_server else "off")
    try:
        await http.serve()
    finally:
        if grpc_server is not None:
            await grpc_server.stop(grace=2)
