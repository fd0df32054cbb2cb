"""The load of bench/soak.py: locust users (locust's library API, headless), in a process of their own (locust
patches the standard library with gevent as it is imported).

    python bench/soak_locust.py CONFIG.json      # written by bench/soak.py; writes CONFIG["records"]

Every user loops without pause: one POST per iteration, a valid request of one of the served models (a body
from the pool soak.py prepared, its expected outputs beside it) or, with probability `bad_share`, a bad one
(wrong shape, malformed JSON, unknown model, wrong input name). Each request carries a unique X-Request-Id;
the servers echo it, so an answer that belongs to another request (a duplicated or crossed response) is seen,
and every request leaves exactly one record. After `load_s` seconds this process sends SIGTERM to the server
while the users keep sending: requests the server already holds must be answered; the first refused
connection after SIGTERM ends a user. Records: one JSON line per request
[id, kind, model, start, end, status, echoed id, verdict, note] (times: time.time()).
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import random
import signal
import sys
import time

import gevent
import numpy as np
from locust import FastHttpUser, constant, task
from locust.env import Environment
from locust.exception import StopUser

from soak import BAD_KINDS  # this folder is the script's: first on sys.path



def check_valid(status: int, body: bytes | None, expected: dict[str, np.ndarray]) -> str:
    """'' when the answer is 200 with the expected outputs (allclose: candidates may differ from the
    reference's), else what is wrong."""
    if status != 200:
        return f"status {status}: {(body or b'')[:200]!r}"
    try:
        outputs = json.loads(body)["outputs"]
    except (ValueError, KeyError, TypeError) as err:
        return f"not an answer: {err}"
    if set(outputs) != set(expected):
        return f"outputs {sorted(outputs)}, expected {sorted(expected)}"
    for name, want in expected.items():
        got = np.asarray(outputs[name], dtype=want.dtype)
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4):
            return f"output {name} differs from this request's expected outputs"
    return ""


def check_bad(kind: str, status: int, body: bytes | None) -> str:
    """'' when a bad request got its 4xx with one error line ({"detail": ...} on one line)."""
    if status not in BAD_KINDS[kind]:
        return f"status {status} (expected {sorted(BAD_KINDS[kind])}): {(body or b'')[:200]!r}"
    text = (body or b"").strip()
    if b"\n" in text:
        return "error answer of more than one line"
    try:
        detail = json.loads(text)["detail"]
    except (ValueError, KeyError, TypeError):
        return f"no detail in {text[:200]!r}"
    return "" if detail else "empty detail"


def main() -> None:
    config = json.loads(open(sys.argv[1]).read())
    with open(config["pool"], "rb") as f:
        pool = pickle.load(f)  # model -> {"valid": [(body, expected)], "bad": {kind: (path, body)}}
    models = sorted(pool)
    weights = [config["weights"].get(m, 1.0) for m in models]
    rng = random.Random(config["seed"])
    state = {"sigterm": None}
    records = open(config["records"], "w", buffering=1 << 16)
    ids = itertools.count()

    class SoakUser(FastHttpUser):
        host = config["host"]
        wait_time = constant(0)
        network_timeout = config["request_timeout_s"]
        connection_timeout = 10.0
        max_retries = 0  # a retried POST could be answered twice

        @task
        def one(self) -> None:
            request_id = f"r{next(ids)}"
            model = rng.choices(models, weights)[0]
            if rng.random() < config["bad_share"]:
                kind = rng.choice(sorted(BAD_KINDS))
                path, body = pool[model]["bad"][kind]
                expected = None
            else:
                kind, path = "valid", f"/v1/models/{model}/infer"
                body, expected = rng.choice(pool[model]["valid"])
            start = time.time()
            status, echoed, verdict, note, content = 0, None, "fail", "", None
            try:
                with self.client.post(path, data=body, name=f"{kind} {model}", catch_response=True,
                                      headers={"Content-Type": "application/json", "X-Request-Id": request_id}) as reply:
                    status = reply.status_code
                    content = reply.content
                    echoed = reply.headers.get("x-request-id") if reply.headers else None
                    if status == 0:
                        note = repr(getattr(reply, "error", None))[:200]
                    elif echoed != request_id:
                        note = f"answer carries id {echoed!r}"
                    else:
                        note = check_valid(status, content, expected) if expected is not None else check_bad(kind, status, content)
                    verdict = "ok" if not note else "fail"
                    if verdict == "ok":
                        reply.success()
                    else:
                        reply.failure(note)
            finally:
                end = time.time()
                records.write(json.dumps([request_id, kind, model, start, end, status, echoed, verdict, note]) + "\n")
            if status == 0 and state["sigterm"] is not None:
                raise StopUser()  # the server is going or gone: this user is done

    env = Environment(user_classes=[SoakUser], host=config["host"])
    runner = env.create_local_runner()
    runner.start(config["users"], spawn_rate=config["users"])
    gevent.sleep(config["load_s"])
    state["sigterm"] = time.time()
    os.kill(config["server_pid"], signal.SIGTERM)
    deadline = time.time() + config["drain_timeout_s"]
    while runner.user_count > 0 and time.time() < deadline:
        gevent.sleep(0.05)
    left = runner.user_count
    runner.quit()
    records.close()
    total = env.stats.total
    summary = {"sigterm": state["sigterm"], "users_left_at_deadline": left, "locust": {
        "requests": total.num_requests, "failures": total.num_failures, "median_ms": total.median_response_time,
        "p99_ms": total.get_response_time_percentile(0.99), "rps": total.total_rps}}
    with open(config["summary"], "w") as f:
        json.dump(summary, f)


if __name__ == "__main__":
    main()
