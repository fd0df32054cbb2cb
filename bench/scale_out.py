"""Scale-out on Ray Serve (issue 40, step 5): what the Ray path costs and how it routes, on a local Ray instance.

    python bench/scale_out.py [--requests 400] [--out bench/results/raw/scale_out.json]

Three models (mlp, as the zoo builds it, under three names) in one Triton-layout repository; two replicas
(`tvmsched serve-ray`'s app: each replica one Runtime, at most two models each, Ray's multiplexing choosing them).
The local Ray instance declares 2 GPUs (one per replica; the Runtimes run on the CPU).
- **Proxy overhead.** tritonclient HTTP and gRPC, one request at a time: direct to `tvmsched serve` (one process,
  the same repository) against through Ray Serve (its HTTP or gRPC proxy, then a replica). The four ways run
  in turn in rounds of 50. Reported: p50 and p99 of each way and each protocol's differences.
- **Routing.** The share of requests that found their model already loaded on the replica Ray chose:
  1 - loads / requests, after the first request of each model. Loads are counted by the replicas.
- **A replica killed under load**, and **scaling 1 -> 2 -> 1 under load**: requests answered, and requests failed
  (each failure must be one line).
"""

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _common  # noqa: E402
from tests.helpers import ray_replica_counts, triton_infer  # noqa: E402

MODELS = ("a", "b", "c")


def repository(root: Path, artifact: Path) -> Path:
    for name in MODELS:
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text('backend: "tvmsched"\nmax_batch_size: 0\n')
        (root / name / "1" / "model.tvms").symlink_to(artifact)
    return root


def latencies_ms(url: str, count: int, grpc: bool = False) -> list[float]:
    if grpc:
        import tritonclient.grpc as http
    else:
        import tritonclient.http as http

    client = http.InferenceServerClient(url)
    tensor = http.InferInput("input", [1, 784], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 784), np.float32))
    out = []
    for i in range(count):
        start = time.perf_counter()
        client.infer(MODELS[i % 3], [tensor])
        out.append((time.perf_counter() - start) * 1e3)
    client.close()
    return out


def percentile(values, q):
    return float(np.percentile(values, q))


def under_load(url: str, during, threads: int = 4) -> dict:
    """Requests sent by `threads` clients while `during()` runs: answered and failed (failures' lines)."""
    stop = threading.Event()
    answered, failed = [0], []

    def client():
        rng = np.random.default_rng(threading.get_ident() % 1000)
        i = 0
        while not stop.is_set():
            got = triton_infer(url, MODELS[i % 3], rng.standard_normal((1, 784)).astype(np.float32))
            i += 1
            if isinstance(got, str):
                failed.append(got.strip())
            else:
                answered[0] += 1

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    try:
        during()
    finally:
        stop.set()
        for w in workers:
            w.join()
    return {"answered": answered[0], "failed": len(failed), "one_line": all("\n" not in f for f in failed),
            "examples": failed[:3]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="per way, for the proxy overhead")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import ray
    from ray import serve

    from tests.helpers import free_port, start_serve, stop_server
    from tvmsched import models
    from tvmsched.pipeline import compile_model
    from tvmsched.serve.ray_app import RaySettings, build_app, run

    work = Path(tempfile.mkdtemp(prefix="scale-out-"))
    artifact = work / "mlp.tvms"
    compile_model(models.build("mlp"), name="mlp").save(artifact)
    repo = repository(work / "repo", artifact)
    report = {"machine": _common.machine_info(), "date": time.strftime("%Y-%m-%d %H:%M"), "command": " ".join(sys.argv),
              "load_average": os.getloadavg()}

    direct, base, direct_grpc = start_serve("--model-repository", str(repo))
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False)
    port, grpc_port = free_port(), free_port()
    settings = RaySettings(str(repo), replicas=2, max_models_per_replica=2, num_cpus=1, num_gpus=1)
    run(settings, port=port, grpc_port=grpc_port, blocking=False)
    ray_url, direct_url = f"127.0.0.1:{port}", base.removeprefix("http://")
    urls = {"direct": (direct_url, False), "ray": (ray_url, False),
            "direct-grpc": (direct_grpc, True), "ray-grpc": (f"127.0.0.1:{grpc_port}", True)}
    try:
        for url, grpc in urls.values():
            latencies_ms(url, 30, grpc)  # warm: every model loaded on every way
        ways = {way: [] for way in urls}
        for _ in range(max(1, args.requests // 50)):  # in turn, rounds of 50
            for way, (url, grpc) in urls.items():
                ways[way] += latencies_ms(url, 50, grpc)
        report["latency_ms"] = {w: {"p50": percentile(v, 50), "p99": percentile(v, 99), "n": len(v)}
                                for w, v in ways.items()}
        report["added_ms"] = {q: report["latency_ms"]["ray"][q] - report["latency_ms"]["direct"][q]
                              for q in ("p50", "p99")}
        report["added_grpc_ms"] = {q: report["latency_ms"]["ray-grpc"][q] - report["latency_ms"]["direct-grpc"][q]
                                   for q in ("p50", "p99")}
        before = ray_replica_counts()
        rng = np.random.default_rng(1)
        sent = [(MODELS[int(i)], rng.standard_normal((1, 784)).astype(np.float32)) for i in rng.integers(0, 3, 600)]
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda item: triton_infer(ray_url, *item), sent))
        after = ray_replica_counts()
        requests = sum(c["requests"] for c in after) - sum(c["requests"] for c in before)
        loads = sum(c["loads"] for c in after) - sum(c["loads"] for c in before)
        report["routing"] = {"requests": requests, "loads": loads, "held_share": 1 - loads / max(requests, 1),
                             "failed": sum(isinstance(a, str) for a in answers), "replicas": after}

        def kill():
            time.sleep(1.0)
            names = [n for n in ray.util.list_named_actors(all_namespaces=True) if "TvmschedReplica" in n["name"]]
            ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)
            time.sleep(2.0)

        report["kill"] = under_load(ray_url, kill)

        def scale():
            for replicas in (1, 2, 1):
                serve.run(build_app(dataclasses.replace(settings, replicas=replicas)), name="tvmsched",
                          route_prefix="/", blocking=False)
                time.sleep(2.0)

        report["scale_1_2_1"] = under_load(ray_url, scale)
    finally:
        serve.shutdown()
        ray.shutdown()
        stop_server(direct)
    report["load_average_end"] = os.getloadavg()
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1, default=str))
    if args.out:
        _common.write_json_atomic(args.out, report)


if __name__ == "__main__":
    main()
