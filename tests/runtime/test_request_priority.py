"""Runtime.submit(priority=): one request's priority, apart from its model's (what `tvmsched serve` maps
parameters.priority to)."""

import time

import numpy as np
import pytest

from tvmsched import models
from tvmsched.errors import TvmschedError
from tvmsched.runtime import Runtime


@pytest.fixture(scope="module")
def artifacts(compiled):
    built = {}
    for name in ("mlp", "bert-tiny"):
        model = models.build(name)
        built[name] = (model, compiled(model, name=name))  # shared, read only
    return built


def test_a_real_time_request_of_a_best_effort_model_preempts_the_others_but_not_its_own(artifacts, reference):
    (mlp_onnx, mlp_path), (bert_onnx, bert_path) = artifacts["mlp"], artifacts["bert-tiny"]
    with Runtime("cpu") as rt:
        mlp, bert = rt.load(mlp_path, name="mlp"), rt.load(bert_path, name="bert")
        x = {"input": np.random.default_rng(0).random((1, 784), dtype=np.float32)}
        h = bert.task.executor.random_inputs(1)
        for _ in range(20):  # bert busy with queued requests when mlp's real-time request arrives
            busy = [rt.submit(bert, h) for _ in range(6)]
            ahead = [rt.submit(mlp, x) for _ in range(3)]  # its own stream busy too: preempting it would hang
            answer = rt.submit(mlp, x, priority="realtime").result(timeout=60)
            outputs = [f.result(timeout=60) for f in busy]
            [f.result(timeout=60) for f in ahead]
            if bert.task.preemptions:
                break
        np.testing.assert_allclose(answer["output"], reference(mlp_onnx, x)["output"], rtol=1e-4, atol=1e-5)
        want = reference(bert_onnx, h)
        for out in outputs:  # preempted and resumed: still right
            for name, value in want.items():
                np.testing.assert_allclose(out[name], value, rtol=1e-3, atol=1e-4)
        assert bert.task.preemptions >= 1
        assert mlp.task.preemptions == 0  # its own stream ran the request
        before = bert.task.preemptions
        busy = [rt.submit(bert, h) for _ in range(4)]
        rt.submit(mlp, x, priority="best_effort").result(timeout=60)  # preempts nothing
        [f.result(timeout=60) for f in busy]
        assert bert.task.preemptions == before
        with pytest.raises(TvmschedError, match="priority must be one of"):
            rt.submit(mlp, x, priority="urgent")


def test_a_request_still_queued_at_its_deadline_fails_instead_of_starting_late(artifacts, reference):
    mlp_onnx, mlp_path = artifacts["mlp"]
    with Runtime("cpu") as rt:
        mlp = rt.load(mlp_path, name="mlp")
        x = {"input": np.random.default_rng(1).random((1, 784), dtype=np.float32)}
        rt.preempt(mlp)  # paused: nothing starts until resume()
        late = rt.submit(mlp, x, start_within_us=2000)
        roomy = rt.submit(mlp, x, start_within_us=60e6)
        plain = rt.submit(mlp, x)
        time.sleep(0.05)
        rt.resume(mlp)
        with pytest.raises(TvmschedError, match=r"model mlp: the request did not start within its deadline \(queued \d+ us, \d+ us past it\)"):
            late.result(timeout=60)
        assert late.request.started_us == 0  # it never ran
        want = reference(mlp_onnx, x)["output"]
        for future in (roomy, plain):  # the stream goes on with the requests behind it
            np.testing.assert_allclose(future.result(timeout=60)["output"], want, rtol=1e-4, atol=1e-5)
        assert rt.stats()["mlp"]["errors"] == 1 and rt.stats()["mlp"]["requests"] == 2
        # a real-time request takes a deadline too, and one that starts in time runs
        np.testing.assert_allclose(rt.submit(mlp, x, priority="realtime", start_within_us=60e6).result(timeout=60)["output"],
                                   want, rtol=1e-4, atol=1e-5)
