"""Locust users for `tvmsched serve`'s v2 HTTP protocol: each posts one model's inference request in a loop and
checks the answer against the expected outputs (a wrong or missing answer is a locust failure).

    KSERVE_LOCUST_DATA=data.npz locust -f bench/locust_kserve.py --headless -u 4 -r 4 -t 5s --host http://127.0.0.1:8000

data.npz holds `model` (the served name), `input_name`, `input` and `output` (the expected outputs); half the
requests send the input as binary tensor data, half as JSON. With KSERVE_LOCUST_COUNTS=counts.json, the counts of
requests sent, answered right and answered wrong are written there as locust quits (locust's own statistics stop
at the time limit, before the users' last requests end). tests/serve/test_kserve_locust.py runs this.
"""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
from locust import FastHttpUser, events, task

DATA = np.load(os.environ["KSERVE_LOCUST_DATA"])
MODEL, NAME = str(DATA["model"]), str(DATA["input_name"])
INPUT, EXPECTED = DATA["input"].astype(np.float32), DATA["output"]
JSON_BODY = json.dumps({"inputs": [{"name": NAME, "datatype": "FP32", "shape": list(INPUT.shape),
                                    "data": INPUT.ravel().tolist()}]})
HEADER = json.dumps({"inputs": [{"name": NAME, "datatype": "FP32", "shape": list(INPUT.shape),
                                 "parameters": {"binary_data_size": INPUT.nbytes}}],
                     "parameters": {"binary_data_output": True}}).encode()
counter = itertools.count()
COUNTS = {"sent": 0, "right": 0, "wrong": 0}


@events.quitting.add_listener
def write_counts(**_kwargs) -> None:
    path = os.environ.get("KSERVE_LOCUST_COUNTS")
    if path:
        with open(path, "w") as out:
            json.dump(COUNTS, out)


class KServeUser(FastHttpUser):
    @task
    def infer(self) -> None:
        binary = next(counter) % 2 == 0
        kwargs = ({"data": HEADER + INPUT.tobytes(), "headers": {"Inference-Header-Content-Length": str(len(HEADER))}}
                  if binary else {"data": JSON_BODY, "headers": {"Content-Type": "application/json"}})
        COUNTS["sent"] += 1
        with self.client.post(f"/v2/models/{MODEL}/infer", catch_response=True, name="binary" if binary else "json",
                              **kwargs) as reply:
            problem = check(reply, binary)
            COUNTS["wrong" if problem else "right"] += 1
            if problem:
                reply.failure(problem)
            else:
                reply.success()


def check(reply, binary: bool) -> str:
    if reply.status_code != 200:
        return f"status {reply.status_code}: {(reply.content or b'')[:200]!r}"
    try:
        if binary:
            length = int(reply.headers["Inference-Header-Content-Length"])
            got = np.frombuffer(reply.content[length:], np.float32)
        else:
            got = np.array(json.loads(reply.content)["outputs"][0]["data"], np.float32)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        return f"not an answer: {err}"
    if got.size != EXPECTED.size or not np.allclose(got.reshape(EXPECTED.shape), EXPECTED, rtol=1e-3, atol=1e-4):
        return "outputs differ from the expected ones"
    return ""
