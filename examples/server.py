"""Example HTTP inference server embedding tvmsched's Runtime.

    python examples/server.py --model resnet=r.tvms:20:realtime --model bert=b.tvms:200 --port 8080
    curl -X POST localhost:8080/v1/models/resnet/infer -d '{"inputs": {"input": [[...]]}}'
    curl localhost:8080/metrics      # Prometheus text format

Each --model is NAME=ARTIFACT[:QOS_MS[:PRIORITY]] (priority realtime or best_effort). --colocation URL
loads this device's interference profile from a tuning database (`tvmsched profile-coloc --db URL`).
--trust KEY.pub (repeatable) loads only artifacts signed by one of those keys (README, "Trust model").
An artifact is native code that runs with the server's rights as it loads: without --trust nothing is
verified beyond checksums (anyone can recompute them), so a server loading artifacts it did not build
must pass --trust; TVMSCHED_REQUIRE_SIGNATURE=1 in the environment refuses any artifact loaded without it.
A request body over --max-body-bytes (default 16 MiB) is answered 413 before more of it is read.
A request's X-Request-Id header comes back on its answer. SIGTERM: no new connections, the requests in flight
are answered, queued ones finish, exit status 0 (bench/soak.py checks it under load).

GET /metrics (prometheus-client, one registry per app): per model tvmsched_requests_total,
tvmsched_errors_total, tvmsched_qos_violations_total, tvmsched_preemptions_total and the histogram
tvmsched_request_latency_seconds; per device the gauge tvmsched_busy_streams. build/cpp/tvmsched_server
(examples/cpp) serves the same names.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import numpy as np
from fastapi import FastAPI, HTTPException, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from pydantic import BaseModel

from tvmsched.errors import TvmschedError, printable
from tvmsched.runtime import Runtime
from tvmsched.serve.asgi import MAX_BODY_BYTES, AnswerHeaders, BodyLimit, draining_server


class InferRequest(BaseModel):
    inputs: dict[str, list | float | int]


LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own (so several apps can live in one process).

    requests: inference requests received for a loaded model; errors: those answered 400; latency:
    submit to outputs as the handler sees it (seconds), of the requests that succeeded; QoS violations:
    those slower than the model's qos_ms; preemptions: times a real-time request preempted the model's
    stream (the engine counts each preempt() of a stream; the Priorities policy calls it);
    busy streams: the runtime's streams with requests queued or running, per device.
    """

    def __init__(self, runtime: Runtime):
        self.registry = CollectorRegistry()
        per_model = dict(labelnames=["model"], registry=self.registry)
        self.requests = Counter("tvmsched_requests", "Inference requests received, per model", **per_model)
        self.errors = Counter("tvmsched_errors", "Inference requests answered with an error, per model", **per_model)
        self.qos_violations = Counter("tvmsched_qos_violations", "Requests whose latency exceeded the model's QoS target", **per_model)
        self.registry.register(_Preemptions(runtime))
        self.latency = Histogram("tvmsched_request_latency_seconds", "Submit-to-outputs latency of completed requests",
                                 buckets=LATENCY_BUCKETS, **per_model)
        busy = Gauge("tvmsched_busy_streams", "Model streams with requests queued or running, per device", ["device"],
                     registry=self.registry)
        busy.labels(runtime.device).set_function(lambda: sum(m.task.busy for m in list(runtime.models.values())))

    def add_model(self, model) -> None:
        """Start the model's series at 0."""
        for counter in (self.requests, self.errors, self.qos_violations):
            counter.labels(model.name)
        self.latency.labels(model.name)

    def observe(self, model, seconds: float) -> None:
        self.latency.labels(model.name).observe(seconds)
        if model.qos_ms is not None and seconds * 1e3 > model.qos_ms:
            self.qos_violations.labels(model.name).inc()


class _Preemptions:
    """tvmsched_preemptions_total per model: the engine's count of its stream's preemptions, read at scrape."""

    def __init__(self, runtime: Runtime):
        self.runtime = runtime

    def collect(self):
        family = CounterMetricFamily("tvmsched_preemptions", "Times the model's stream was preempted by a real-time request",
                                     labels=["model"])
        for name, model in list(self.runtime.models.items()):
            family.add_metric([name], model.task.preemptions)
        yield family


def parse_model(spec: str) -> tuple[str, str, float | None, str]:
    """NAME=ARTIFACT[:QOS_MS[:PRIORITY]], as `tvmsched serve --model` reads it."""
    from tvmsched.serve.repository import parse_model as parse

    model = parse(spec)
    return model.name, model.path, model.qos_ms, model.priority


def create_app(specs: list[tuple[str, str, float | None, str]], device: str = "cpu", colocation: str | None = None,
               trusted_keys: list[str] | tuple = (), max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    runtime = Runtime(device, colocation=colocation, trusted_keys=trusted_keys)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        runtime.shutdown()  # finish queued requests, stop the streams

    app = FastAPI(title="tvmsched inference", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(AnswerHeaders)  # outermost: the 413 of BodyLimit carries the id too
    metrics = Metrics(runtime)
    try:
        for name, path, qos_ms, priority in specs:
            metrics.add_model(runtime.load(path, qos_ms=qos_ms, priority=priority, name=name))
    except BaseException:
        runtime.shutdown()
        raise
    app.state.runtime = runtime
    app.state.metrics = metrics
    input_dtypes = {name: {b.name: m.task.executor.manifest.tensors[b.tensor].dtype for b in m.task.executor.manifest.inputs}
                    for name, m in runtime.models.items()}  # per model, input name -> dtype (not per request)

    @app.get("/v1/models")
    def list_models() -> dict:
        return {name: {"qos_ms": m.qos_ms, "priority": m.priority,
                       "inputs": {b.name: list(m.task.executor.manifest.tensors[b.tensor].shape)
                                  for b in m.task.executor.manifest.inputs}}
                for name, m in runtime.models.items()}

    @app.post("/v1/models/{name}/infer")
    async def infer(name: str, request: InferRequest) -> dict:
        model = runtime.models.get(name)
        if model is None:
            loaded = ", ".join(sorted(runtime.models)) or "none"  # (the engine's line, as both servers answer it)
            raise HTTPException(404, f"no model named {name!r} is loaded (loaded: {loaded})")
        metrics.requests.labels(name).inc()
        dtypes = input_dtypes[name]
        try:
            inputs = {k: np.asarray(v, dtype=dtypes.get(k, "float32")) for k, v in request.inputs.items()}
            started = time.perf_counter()
            outputs = await runtime.infer(model, inputs)
        except (TvmschedError, ValueError, TypeError) as err:
            metrics.errors.labels(name).inc()
            raise HTTPException(400, str(err)) from None
        metrics.observe(model, time.perf_counter() - started)
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}

    @app.get("/v1/stats")
    def stats() -> dict:
        return runtime.stats()

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="NAME=ARTIFACT[:QOS_MS[:PRIORITY]]")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--colocation", help="tuning-database URL holding a colocation profile of this device")
    parser.add_argument("--trust", action="append", default=[], metavar="KEY.pub",
                        help="load only artifacts signed by this Ed25519 public key (repeatable); without it an "
                        "artifact's code runs unverified (TVMSCHED_REQUIRE_SIGNATURE=1 makes it mandatory)")
    parser.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES, help="larger request bodies get 413")
    args = parser.parse_args()
    try:
        if args.max_body_bytes < 1:
            raise TvmschedError("--max-body-bytes must be positive")
        app = create_app([parse_model(spec) for spec in args.model], args.device, args.colocation, args.trust,
                         args.max_body_bytes)
    except TvmschedError as err:
        print(f"error: {printable(str(err))}", file=sys.stderr)
        sys.exit(2)
    draining_server(app, args.host, args.port).run()


if __name__ == "__main__":
    main()
