"""Mechanism E for real: jobs of 2-4 ranks train with DDP through their agents, one controller, one
aggregation service, all processes on 127.0.0.1 (Gloo), bounded in time."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from multiprocessing import forkserver
from pathlib import Path

import numpy as np
import pytest

from tvmsched.runtime.collectives.controller import Controller, Faults
from tvmsched.runtime.collectives.switch import SwitchServer

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "ddp_train.py"

JOBS = {"a": 2, "b": 3, "c": 4}  # job → ranks
STEPS = 60
DEADLINE_S = 900  # a hang guard: nine torch processes on a loaded 2-core machine may take minutes
PROCESS_GROUP_TIMEOUT_S = 120  # Gloo's rendezvous and collectives (a peer still importing torch is not dead)
RANK_ENV = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forkserver():
    """The ranks are forked from one process that has imported torch, Gloo's bindings and the example once
    (multiprocessing's forkserver, started here with the ranks' environment): importing torch takes ~2.3 CPU-s
    per process, and this module starts 21 ranks on a 2-core machine. Each rank is still a process of its own
    that runs the example's `main` with its command line, and is killed and waited for like one."""
    ctx = multiprocessing.get_context("forkserver")
    _example_importable()
    ctx.set_forkserver_preload(["torch", "torch.distributed", "ddp_train"])
    saved = {name: os.environ.get(name) for name in RANK_ENV}
    os.environ.update(RANK_ENV)  # read when torch is imported, so the server must start with them
    try:
        forkserver.ensure_running()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return ctx


def _example_importable() -> None:
    """examples/ddp_train.py importable as `ddp_train` (its `main` runs the ranks, its `model` the reference)."""
    if str(TRAIN.parent) not in sys.path:
        sys.path.insert(0, str(TRAIN.parent))


def _launch(tmp: Path, jobs: dict[str, int], controller: int, switch: int, extra=(), steps=STEPS):
    ctx = _forkserver()
    from ddp_train import main as train
    procs = {}
    for job, world in jobs.items():
        port = _free_port()
        for rank in range(world):
            argv = ["--job", job, "--rank", str(rank), "--world", str(world), "--master-port", str(port),
                    "--controller", f"127.0.0.1:{controller}", "--switch", f"127.0.0.1:{switch}", "--steps", str(steps),
                    "--wait-state", "120", "--timeout", str(PROCESS_GROUP_TIMEOUT_S), "--out", str(tmp / f"{job}{rank}.json"),
                    *extra]
            procs[(job, rank)] = ctx.Process(target=train, args=(argv,), name=f"rank {job}{rank}")
            procs[(job, rank)].start()
    return procs


def _wait(procs, deadline_s=DEADLINE_S):
    end = time.time() + deadline_s
    for key, p in procs.items():
        p.join(timeout=max(end - time.time(), 0.1))
        if p.is_alive():
            for q in procs.values():
                q.kill()
            pytest.fail(f"rank {key} hung (still running after {deadline_s} s)")


def _reports(tmp: Path, jobs: dict[str, int]):
    return {(j, r): json.loads((tmp / f"{j}{r}.json").read_text()) for j, w in jobs.items() for r in range(w)}


def _reference_params(world: int, steps: int) -> np.ndarray:
    """What plain data-parallel SGD gives: every rank's gradient on its own batches, averaged (the
    plain AllReduce), applied to one model — computed in this process, no communication at all. (torch and the
    example are imported here, not at collection, which every pytest worker does.)"""
    import torch

    _example_importable()
    from ddp_train import model as train_model

    torch.manual_seed(0)
    net = train_model(256, 3)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    gens = [torch.Generator().manual_seed(1000 + r) for r in range(world)]
    for _ in range(steps):
        grads = None
        for g in gens:
            x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            mine = [p.grad.clone() for p in net.parameters()]
            grads = mine if grads is None else [a + b for a, b in zip(grads, mine)]
        for p, gsum in zip(net.parameters(), grads):
            p.grad = gsum / world
        opt.step()
    params = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    return params[:: max(1, params.numel() // 4096)].numpy()


def _assert_same_decisions(reports, jobs):
    for job, world in jobs.items():
        logs = [reports[(job, r)]["decisions"] for r in range(world)]
        n = min(len(log) for log in logs)
        assert n > 0
        for r in range(1, world):
            assert logs[r][:n] == logs[0][:n], f"job {job}: rank {r} decided differently from rank 0"


def _overlaps(log):
    ops = [e for e in log if e["verdict"] == "done"]
    return [(a, b) for a, b in itertools.combinations(ops, 2)
            if a["job"] != b["job"] and a["start"] < b["end"] and b["start"] < a["end"]]


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory):
    """Three jobs (2, 3 and 4 ranks) train at once through their agents under the TDM controller."""
    tmp = tmp_path_factory.mktemp("tdm")
    switch = SwitchServer(op_timeout_s=2.0)
    sport = switch.start()
    ctl = Controller(policy="tdm", refresh_s=0.2, lease_s=2.0)
    cport = ctl.start()
    try:
        _wait(_launch(tmp, JOBS, cport, sport))
        yield _reports(tmp, JOBS), switch.log(), ctl.rounds
    finally:
        ctl.stop()
        switch.stop()


def test_gradients_equal_a_plain_allreduce(shared_run):
    reports, _, _ = shared_run
    for job, world in JOBS.items():
        ref = _reference_params(world, STEPS)
        for r in range(world):
            rep = reports[(job, r)]
            assert rep["error"] is None, rep["error"]
            np.testing.assert_allclose(rep["params"], ref, rtol=1e-4, atol=1e-5, err_msg=f"job {job} rank {r}")
        assert len({reports[(job, r)]["params_sha"] for r in range(world)}) == 1  # ranks stay identical


def test_jobs_share_the_switch_but_never_at_once(shared_run):
    reports, log, rounds = shared_run
    assert not _overlaps(log)
    done_jobs = {e["job"] for e in log if e["verdict"] == "done"}
    assert done_jobs == set(JOBS), f"only {done_jobs} aggregated in the network"
    for job, _world in JOBS.items():
        paths = reports[(job, 0)]["stats"]["paths"]
        assert paths.get("innet", 0) > 0 and paths.get("ring", 0) > 0, paths  # the switch is shared in time
    assert any(r["outcome"] == "commit" for r in rounds)


def test_every_rank_of_a_job_takes_the_same_decision(shared_run):
    reports, _, _ = shared_run
    _assert_same_decisions(reports, JOBS)
    for job, world in JOBS.items():  # and settled every round they took part in the same way
        recs = [{rid: out for rid, out, _ in reports[(job, r)]["rounds"]} for r in range(world)]
        for rec in recs[1:]:
            assert all(rec[k] == recs[0][k] for k in rec.keys() & recs[0].keys()), f"job {job}: a round split"
        # a rank that closed its agent after training misses the rounds that came later: compare before that
        horizon = min(max(rec) for rec in recs)
        committed = [{k for k, out in rec.items() if out == "commit" and k < horizon} for rec in recs]
        assert all(c == committed[0] for c in committed) and committed[0]


def test_lost_and_late_protocol_messages_never_split_a_job(tmp_path):
    switch = SwitchServer(op_timeout_s=2.0)
    sport = switch.start()
    ctl = Controller(policy="tdm", refresh_s=0.1, lease_s=2.0, round_timeout_s=0.2,
                     faults=Faults(drop=0.25, delay_s=(0.0, 0.4), seed=3))
    cport = ctl.start()
    jobs = {"a": 2, "b": 3}
    try:
        _wait(_launch(tmp_path, jobs, cport, sport, extra=["--drop-replies", "0.2"]))
        reports = _reports(tmp_path, jobs)
    finally:
        ctl.stop()
        switch.stop()
    assert any(r["outcome"] != "commit" for r in ctl.rounds)  # the faults did bite ...
    assert any(r.get("seqs") for r in ctl.rounds)  # ... and jobs still agreed on new states
    _assert_same_decisions(reports, jobs)
    assert not _overlaps(switch.log())
    for job, world in jobs.items():
        assert all(reports[(job, r)]["error"] is None for r in range(world))
        np.testing.assert_allclose(reports[(job, 0)]["params"], _reference_params(world, STEPS), rtol=1e-4, atol=1e-5)


def test_kill_one_rank_and_the_controller_nothing_hangs(tmp_path):
    """Seven torch ranks of three jobs run 400 steps each while a rank and then the controller are killed (~1 min on 2
    cores: seven processes importing torch and training; the failure and the lease running out are the subject)."""
    switch = SwitchServer(op_timeout_s=1.0)
    sport = switch.start()
    cport = _free_port()
    controller = subprocess.Popen([sys.executable, "-m", "tvmsched.cli", "collectives", "controller", "--port", str(cport),
                                   "--lease", "1.0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "listening" in controller.stdout.readline()
        jobs = {"a": 2, "b": 2, "c": 3}
        procs = _launch(tmp_path, jobs, cport, sport, extra=["--compute-ms", "10"], steps=400)
        _until(lambda: all((tmp_path / f"{j}{r}.json.running").exists() for j, w in jobs.items() for r in range(w)), DEADLINE_S)
        os.kill(procs[("b", 1)].pid, signal.SIGKILL)
        _until(lambda: len(switch.log()) > 40, DEADLINE_S)
        controller.kill()
        survivors = {k: p for k, p in procs.items() if k != ("b", 1)}
        _wait(survivors)
        reports = {k: json.loads((tmp_path / f"{k[0]}{k[1]}.json").read_text()) for k in survivors}
    finally:
        controller.kill()
        switch.stop()
    assert "Error" in reports[("b", 0)]["error"]  # its peer died: the job fails, it does not hang
    for key in [k for k in survivors if k[0] != "b"]:
        assert reports[key]["error"] is None, reports[key]["error"]
        assert len(reports[key]["steps"]) == 400
    ab = {j: w for j, w in jobs.items() if j != "b"}
    _assert_same_decisions({k: v for k, v in reports.items() if k[0] != "b"}, ab)
    for job in ab:  # after the controller died, the last lease ran out and the job went on with ring
        tail = reports[(job, 0)]["decisions"][-20:]
        assert all(not innet for _, _, innet, _ in tail)
        np.testing.assert_allclose(reports[(job, 0)]["params"], _reference_params(jobs[job], 400), rtol=1e-3, atol=1e-4)


def _until(cond, timeout_s):
    end = time.time() + timeout_s
    while not cond():
        if time.time() > end:
            pytest.fail("timed out waiting for the jobs to make progress")
        time.sleep(0.05)


def test_controller_drops_a_hostile_peer_and_keeps_serving():
    from tvmsched.runtime.collectives import wire

    ctl = Controller(policy="tdm", refresh_s=0.05)
    port = ctl.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as bad:  # not a hello
            wire.send(bad, {"op": "prepared", "round": [1]})
            reply, _ = wire.recv(bad)
            assert reply == {"ok": False, "error": "the first message must be hello"}
        with socket.create_connection(("127.0.0.1", port), timeout=60) as bad:  # a profile no state can hold
            wire.send(bad, {"op": "hello", "job": "x", "rank": 0, "world": 1})
            assert wire.recv(bad)[0]["ok"]
            wire.send(bad, {"op": "profile", "profile": {"step_s": -1, "ops": [], "hosts": 1}, "ref_seq": 0, "ref_time": 0})
            while "ok" not in (msg := wire.recv(bad)[0]):  # rounds for x go on until the bad report lands
                if msg["op"] == "prepare":
                    wire.send(bad, {"op": "prepared", "round": msg["round"], "seq": 0})
            assert msg["ok"] is False and "bad profile report" in msg["error"]
        with socket.create_connection(("127.0.0.1", port), timeout=60) as good:  # and a well-behaved job still gets rounds
            wire.send(good, {"op": "hello", "job": "y", "rank": 0, "world": 1})
            assert wire.recv(good)[0]["ok"]
            assert wire.recv(good)[0]["op"] == "prepare"
    finally:
        ctl.stop()
