"""Where `tvmsched serve`'s time inside the server goes, per request at concurrency 1 (issue 38's split): parse,
submit, queue (the engine: submit to start), wake-up (the engine finished it to the handler holding its outputs),
encode — measured in-process on the handler's own functions, one request at a time, for a REST binary-tensor body
(serve/http.py's infer route) and a gRPC ModelInferRequest's bytes (serve/grpc_server.py's ModelInfer), with the
HTTP and gRPC layers (uvicorn, grpc.aio, middleware) left out; bench/cpp_server_overhead.py measures the whole servers.

    python bench/serve_split.py ARTIFACT.tvms [--requests 2000] [--rounds 5]

The request is what tritonclient sends for the model's inputs (random, seeded): the binary-tensor body, or the
ModelInferRequest with raw_input_contents. Each phase is timed with
the engine's clock (native.now_us) and reported as the median over the requests of each round, then the median of
the rounds; `total inside` is parse + submit + wake-up + encode (what Triton's statistics call the server's own time:
success - queue - compute_infer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PHASES = ("parse", "submit", "queue", "wake", "encode", "total inside")


def binary_body(inputs: dict[str, np.ndarray], outputs: list[str]) -> tuple[dict, bytes]:
    """(headers, body) of tritonclient's binary-tensor request: every input as binary data, every output asked back so."""
    from tvmsched.serve.tensors import V2_TYPES

    header = json.dumps({"inputs": [{"name": k, "datatype": V2_TYPES[v.dtype], "shape": list(v.shape),
                                     "parameters": {"binary_data_size": v.nbytes}} for k, v in inputs.items()],
                         "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs]}).encode()
    return {"Inference-Header-Content-Length": str(len(header))}, header + b"".join(v.tobytes() for v in inputs.values())


def tensors(served, side: str) -> list[tuple[str, str, list[int], np.dtype]]:
    """(name, datatype, shape, dtype) of the served model's "inputs" or "outputs", as its metadata gives them (a batched
    model's any-rows dimension as 1)."""
    from tvmsched.serve.tensors import DATATYPES

    return [(t["name"], t["datatype"], [max(d, 1) for d in t["shape"]], np.dtype(DATATYPES[t["datatype"]]))
            for t in json.loads(served.book.metadata())[side]]


def binary_request(served) -> tuple[dict, bytes]:
    """binary_body of the served model's inputs (random, seeded) and outputs."""
    rng = np.random.default_rng(0)
    return binary_body({name: rng.random(shape).astype(dtype) for name, _, shape, dtype in tensors(served, "inputs")},
                       [name for name, *_ in tensors(served, "outputs")])


def grpc_message(model: str, inputs: dict[str, np.ndarray], outputs: list[str], pb2=None) -> bytes:
    """The ModelInferRequest tritonclient.grpc sends: every input as raw contents, every output asked for. `pb2`: the
    generated module to build it with (tvmsched's by default; a process that has imported tritonclient.grpc passes
    its `service_pb2`, since both register grpc_service.proto)."""
    from tvmsched.serve.tensors import V2_TYPES

    if pb2 is None:
        from tvmsched.serve.grpc_stubs import stubs

        pb2 = stubs()[0]
    message = pb2.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        message.inputs.add(name=name, datatype=V2_TYPES[value.dtype], shape=list(value.shape))
        message.raw_input_contents.append(value.tobytes())
    for name in outputs:
        message.outputs.add(name=name)
    return message.SerializeToString()


def grpc_request(served) -> bytes:
    """grpc_message of the served model's inputs (random, seeded) and outputs."""
    rng = np.random.default_rng(0)
    return grpc_message(served.name, {name: rng.random(shape).astype(dtype)
                                      for name, _, shape, dtype in tensors(served, "inputs")},
                        [name for name, *_ in tensors(served, "outputs")])


def one_round(service, served, way: str, request, requests: int) -> dict[str, float]:
    """As serve/http.py's infer route (way "rest": request = (headers, body)) or serve/grpc_server.py's ModelInfer
    ("grpc": request = the message's bytes: its model found and the message parsed in one engine call) do: the engine's
    codec parses and encodes, the service admits and counts."""
    from tvmsched.runtime import native

    now = native.now_us
    codec = served.codec
    if way == "rest":
        headers, body = request
        length = headers["Inference-Header-Content-Length"]
        parse, encode = (lambda: codec.parse(body, length)), codec.encode
    else:
        parse, encode = (lambda: service.parse_message(request)[1]), codec.encode_message  # (its model found too)
    times = {p: [] for p in PHASES}
    for _ in range(requests):
        t0 = now()
        parsed = parse()
        t1 = now()
        future = service.submit(served, parsed[1], dict(parsed[2]) if len(parsed[2]) else None, engine_tensors=True)
        t2 = now()
        outputs = service.inline_outputs(served, future)  # as the server's handler waits at concurrency 1
        if outputs is None:
            outputs = future.result(timeout=60)
        t3 = now()
        service.finish(served, future, 0, None)
        answer = encode(parsed[3], outputs)
        assert answer[0] == 0, answer
        t4 = now()
        r = future.request
        times["parse"].append(t1 - t0)
        times["submit"].append(t2 - t1)
        times["queue"].append(r.started_us - r.submitted_us)
        times["wake"].append(t3 - r.finished_us)
        times["encode"].append(t4 - t3)
        times["total inside"].append((t1 - t0) + (t2 - t1) + (t3 - r.finished_us) + (t4 - t3))
    return {p: statistics.median(v) for p, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifacts", nargs="+", type=Path)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from tvmsched.runtime import Runtime
    from tvmsched.serve.repository import ModelSpec
    from tvmsched.serve.service import InferenceService

    load = os.getloadavg()[0]
    with Runtime("cpu") as rt:
        service = InferenceService(rt)
        cases = []
        for path in args.artifacts:
            served = service.add(ModelSpec(name=path.stem, path=path))
            for way, request in (("rest", binary_request(served)), ("grpc", grpc_request(served))):
                one_round(service, served, way, request, 50)  # warm-up
                cases.append((served, way, request))
        rounds = {(served.name, way): [] for served, way, _ in cases}
        for _ in range(args.rounds):  # interleaved
            for served, way, request in cases:
                rounds[served.name, way].append(one_round(service, served, way, request, args.requests))
    print(f"load average (1 min) {load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print("| model | way | " + " | ".join(f"{p} µs" for p in PHASES) + " |")
    print("|---|---|" + "---:|" * len(PHASES))
    for (name, way), results in rounds.items():
        print(f"| {name} | {way} | " + " | ".join(f"{statistics.median(r[p] for r in results):.1f}" for p in PHASES) + " |")

if __name__ == "__main__":
    main()
