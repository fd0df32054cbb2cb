"""Example HTTP inference server embedding tvmsched's Runtime.

    python examples/server.py --model resnet=r.tvms:20:realtime --model bert=b.tvms:200 --port 8080
    curl -X POST localhost:8080/v1/models/resnet/infer -d '{"inputs": {"input": [[...]]}}'

Each --model is NAME=ARTIFACT[:QOS_MS[:PRIORITY]] (priority realtime or best_effort). --colocation URL
loads this device's interference profile from a tuning database (`tvmsched profile-coloc --db URL`).
"""

from __future__ import annotations

import argparse
import contextlib

import numpy as np
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from tvmsched.errors import TvmschedError
from tvmsched.runtime import Runtime


class InferRequest(BaseModel):
    inputs: dict[str, list | float | int]


def parse_model(spec: str) -> tuple[str, str, float | None, str]:
    name, _, rest = spec.partition("=")
    path, qos, priority = (rest.split(":") + ["", ""])[:3]
    if not name or not path:
        raise SystemExit(f"--model {spec!r} is not NAME=ARTIFACT[:QOS_MS[:PRIORITY]]")
    return name, path, float(qos) if qos else None, priority or "best_effort"


def create_app(specs: list[tuple[str, str, float | None, str]], device: str = "cpu", colocation: str | None = None) -> FastAPI:
    runtime = Runtime(device, colocation=colocation)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        runtime.shutdown()  # finish queued requests, stop the streams

    app = FastAPI(title="tvmsched inference", lifespan=lifespan)
    for name, path, qos_ms, priority in specs:
        runtime.load(path, qos_ms=qos_ms, priority=priority, name=name)
    app.state.runtime = runtime

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
            raise HTTPException(404, f"no model named {name!r}")
        manifest = model.task.executor.manifest
        dtypes = {b.name: manifest.tensors[b.tensor].dtype for b in manifest.inputs}
        try:
            inputs = {k: np.asarray(v, dtype=dtypes.get(k, "float32")) for k, v in request.inputs.items()}
            outputs = await runtime.infer(model, inputs)
        except (TvmschedError, ValueError, TypeError) as err:
            raise HTTPException(400, str(err)) from None
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}

    @app.get("/v1/stats")
    def stats() -> dict:
        return runtime.stats()

    return app


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="NAME=ARTIFACT[:QOS_MS[:PRIORITY]]")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--colocation", help="tuning-database URL holding a colocation profile of this device")
    args = parser.parse_args()
    app = create_app([parse_model(spec) for spec in args.model], args.device, args.colocation)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
