"""The switch emulator (mechanism E): a real aggregation service on 127.0.0.1 (on a thread, and as a
process of its own), ranks' clients in threads. Sums are exact; one job holds the slot at a time and
the others are refused, never queued; every rank of an op gets the same verdict; a missing or dead
rank aborts the op and frees the slot; hostile input closes one connection only; the link pacing
follows the SHARP model."""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tvmsched.runtime.collectives import wire
from tvmsched.runtime.collectives.switch import (
    CHUNK, LATENCY_S, SwitchClient, SwitchServer, fetch_log, main, query,
)

HOST = "127.0.0.1"
# Waits, socket timeouts and the ops' own timeout are hang guards: each returns as soon as its event happens, so
# they are generous (a loaded 2-core machine may stall a thread for seconds); no test depends on them firing,
# except the one that sets a short op timeout on purpose.
WAIT_S = 60
OP_TIMEOUT_S = 120.0


@pytest.fixture
def start_switch():
    """Start SwitchServers on background threads; all are stopped after the test."""
    servers = []

    def start(**options) -> SwitchServer:
        server = SwitchServer(**{"op_timeout_s": OP_TIMEOUT_S, **options})  # a slow rank never aborts an op
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def integers(rank: int, count: int, seed: int = 0) -> np.ndarray:
    """Integer-valued float32: their sums are exact in any order."""
    return np.random.default_rng([seed, rank]).integers(-1000, 1000, count).astype(np.float32)


def reduce_once(port: int, job: str, rank: int, world: int, array: np.ndarray, seq: int = 0) -> tuple[str, object]:
    with SwitchClient(HOST, port, job, rank, world) as client:
        status, value = client.reduce(seq, array)
        return status, value.copy() if status == "done" else value


def run_job(port: int, job: str, arrays: list[np.ndarray], seq: int = 0) -> list[tuple[str, object]]:
    """Every rank reduces its array as op `seq` from a thread of its own; the verdicts by rank."""
    with ThreadPoolExecutor(len(arrays)) as pool:
        return list(pool.map(lambda r: reduce_once(port, job, r, len(arrays), arrays[r], seq), range(len(arrays))))


def holding(job: str, field: str = "arrived", rank: int | None = None):
    """A stats predicate: `job` holds a slot (and `rank` is among its arrived or summed ranks)."""
    return lambda stats: any(h["job"] == job and (rank is None or rank in h[field]) for h in stats.get("holders", ()))


def assert_one_at_a_time(log: list[dict]) -> None:
    held = sorted((e["start"], e["end"], e["job"], e["seq"]) for e in log if e["verdict"] != "refused")
    for before, after in zip(held, held[1:]):
        assert before[1] <= after[0], (before, after)


def frame(obj: object) -> bytes:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return struct.pack(">I", len(raw)) + raw


def replies_until_closed(sock: socket.socket) -> list[dict]:
    """Every reply the server sends until it closes the connection (a reset may swallow the last)."""
    replies = []
    try:
        while True:
            replies.append(wire.recv(sock)[0])
    except ConnectionError:
        return replies


HELLO = {"op": "hello", "job": "H", "rank": 0, "world": 2}


def test_sums_are_exact_for_every_rank(start_switch):
    port = start_switch().port
    world, sizes = 4, [0, 1, 1000, 2 * CHUNK // 4 + 3]  # the last crosses chunk boundaries
    clients = [SwitchClient(HOST, port, "A", r, world) for r in range(world)]
    with ThreadPoolExecutor(world) as pool:
        for seq, count in enumerate(sizes):
            arrays = [integers(r, count, seed=seq) for r in range(world)]
            out = arrays[0].copy()  # rank 0 reduces in place
            replies = list(pool.map(
                lambda r: clients[r].reduce(seq, out, out=out) if r == 0 else clients[r].reduce(seq, arrays[r]),
                range(world)))
            expected = np.sum(arrays, axis=0, dtype=np.float32)
            assert [status for status, _ in replies] == ["done"] * world
            assert all(np.array_equal(value, expected) for _, value in replies)
            assert replies[0][1] is out  # received in place
        floats = [np.random.default_rng(r).standard_normal(10_000).astype(np.float32) for r in range(world)]
        replies = list(pool.map(lambda r: clients[r].reduce(len(sizes), floats[r]), range(world)))
    np.testing.assert_allclose(replies[0][1], np.sum(floats, axis=0), rtol=1e-5, atol=1e-5)
    assert all(np.array_equal(value, replies[0][1]) for _, value in replies)  # the same bits on every rank
    for client in clients:
        client.close()


def test_two_jobs_hammering_take_turns_and_agree(start_switch):
    server = start_switch(link_gbps=0.1)  # a 64 KiB op holds the slot ~2.7 ms
    world, count, deadline = 2, 16384, time.monotonic() + WAIT_S  # ends when both counts are reached

    def rank(job: str, r: int) -> list[str]:
        verdicts, array = [], integers(r, count)
        with SwitchClient(HOST, server.port, job, r, world) as client:
            while (verdicts.count("done") < 8 or verdicts.count("refused") < 3) and time.monotonic() < deadline:
                status, value = client.reduce(len(verdicts), array)
                assert status != "done" or np.array_equal(value, integers(0, count) + integers(1, count))
                verdicts.append(status)
        return verdicts

    with ThreadPoolExecutor(4) as pool:
        runs = {(job, r): pool.submit(rank, job, r) for job in "AB" for r in range(world)}
        verdicts = {key: run.result() for key, run in runs.items()}
    for job in "AB":
        assert verdicts[job, 0] == verdicts[job, 1]  # every rank of an op got the same verdict
        assert verdicts[job, 0].count("done") >= 8 and verdicts[job, 0].count("refused") >= 3, verdicts[job, 0]
        assert "aborted" not in verdicts[job, 0]
    log = server.log()
    assert_one_at_a_time(log)
    assert {e["verdict"] for e in log} == {"done", "refused"}
    assert all(sorted(e["ranks"]) == [0, 1] for e in log)


def test_a_refused_op_stays_refused_for_its_later_ranks(start_switch):
    server = start_switch()
    array = integers(0, 100)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(reduce_once, server.port, "A", 0, 2, array)
        server.wait_until(holding("A"), WAIT_S)
        assert reduce_once(server.port, "B", 0, 2, array) == ("refused", "A")
        assert reduce_once(server.port, "A", 1, 2, array)[0] == "done"
        assert first.result()[0] == "done"
    assert server.stats()["holders"] == []
    assert reduce_once(server.port, "B", 1, 2, array) == ("refused", "A")  # though the slot is free now
    assert [status for status, _ in run_job(server.port, "B", [array, array], seq=1)] == ["done", "done"]


def test_a_missing_rank_times_out_and_frees_the_slot(start_switch):
    """The timeout must fire, so nothing here may need to happen before it does (another job being refused
    while A holds the slot is the test above's, with a timeout that never fires)."""
    server = start_switch(op_timeout_s=0.3)
    array = integers(0, 100)
    with ThreadPoolExecutor(1) as pool:
        began = time.monotonic()
        lonely = pool.submit(reduce_once, server.port, "A", 0, 2, array)
        status, reason = lonely.result(timeout=WAIT_S)
        elapsed = time.monotonic() - began
    assert status == "aborted" and "timeout" in reason
    assert elapsed >= 0.3  # not before the timeout (after it, however slow the machine)
    assert reduce_once(server.port, "B", 0, 1, array)[0] == "done"
    assert reduce_once(server.port, "A", 1, 2, array)[0] == "aborted"  # a late rank gets the same verdict
    entry = next(e for e in server.log() if e["job"] == "A")
    assert entry["verdict"] == "aborted" and entry["ranks"] == [0, 1]


@pytest.mark.parametrize("moment", ["mid-payload", "waiting"])
def test_a_rank_that_closes_aborts_its_op_and_frees_the_slot(start_switch, moment):
    server = start_switch(op_timeout_s=30)  # an abort below comes from the close, not the timeout
    count = 2 * CHUNK // 4
    payload = integers(0, count).tobytes()
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(reduce_once, server.port, "A", 1, 3, integers(1, count))
        server.wait_until(holding("A", "summed", rank=1), WAIT_S)
        sock = socket.create_connection((HOST, server.port), timeout=WAIT_S)
        sock.sendall(frame({"op": "hello", "job": "A", "rank": 0, "world": 3}))
        sock.sendall(frame({"op": "reduce", "job": "A", "seq": 0, "dtype": "float32", "count": count,
                            "nbytes": len(payload)}))
        sock.sendall(payload[: len(payload) // 2] if moment == "mid-payload" else payload)
        server.wait_until(holding("A", "arrived" if moment == "mid-payload" else "summed", rank=0), WAIT_S)
        sock.close()
        status, reason = other.result(timeout=WAIT_S)
    assert status == "aborted" and "rank 0 closed" in reason
    assert server.wait_until(lambda stats: not stats["holders"], WAIT_S)
    assert reduce_once(server.port, "B", 0, 1, integers(0, 10))[0] == "done"
    assert reduce_once(server.port, "A", 2, 3, integers(2, count)) == ("aborted", reason)  # a late rank too


def test_ranks_that_disagree_abort_the_op(start_switch):
    server = start_switch()
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(reduce_once, server.port, "A", 0, 2, integers(0, 10))
        server.wait_until(holding("A"), WAIT_S)
        status, reason = reduce_once(server.port, "A", 1, 2, integers(1, 11))
        assert status == "aborted" and "11 elements" in reason
        assert first.result(timeout=WAIT_S) == ("aborted", reason)
    assert server.stats()["holders"] == []


def test_hostile_input_closes_only_that_connection(start_switch):
    server = start_switch()
    hello = frame(HELLO)
    reduce = {"op": "reduce", "job": "H", "seq": 0, "dtype": "float32", "count": 4, "nbytes": 16}
    framed = [  # whole messages: the error reply must come back before the close
        frame(b"not json"), frame(b"[1, 2]"), frame({"op": "fly"}), frame({"op": ["hello"]}), frame({"no": "op"}),
        frame({"op": "log", "nbytes": -5}), frame({"op": "stats", "nbytes": 8}) + b"x" * 8,
        frame({**HELLO, "job": ["x"]}), frame({**HELLO, "job": True}), frame({**HELLO, "job": ""}),
        frame({**HELLO, "rank": "0"}), frame({**HELLO, "rank": 2}), frame({**HELLO, "world": 0}),
        frame(reduce) + b"\0" * 16, hello + hello,
        hello + frame({**reduce, "count": -4}), hello + frame({**reduce, "dtype": "float16"}),
        hello + frame({**reduce, "nbytes": 12}), hello + frame({**reduce, "seq": -1}),
        hello + frame({**reduce, "job": "other"}), hello + frame({**reduce, "count": 1 << 40, "nbytes": 1 << 42}),
        hello + frame({**reduce, "nbytes": 1 << 33}),
    ]
    unframed = [b"\xde\xad\xbe\xef" * 8, struct.pack(">I", 1 << 30) + b"{}", struct.pack(">I", 0)]
    for message in framed + unframed:
        with socket.create_connection((HOST, server.port), timeout=WAIT_S) as sock:
            sock.sendall(message)
            replies = replies_until_closed(sock)
        errors = [reply for reply in replies if reply.get("ok") is not True]
        assert len(errors) <= 1 and all(reply["ok"] is False and reply["error"] for reply in errors), replies
        assert errors or message in unframed, (message[:80], replies)
    with socket.create_connection((HOST, server.port), timeout=WAIT_S) as sock:  # half a message, then gone
        sock.sendall(hello + frame({**reduce, "count": CHUNK, "nbytes": 4 * CHUNK}) + b"\0" * 100)
    arrays = [integers(r, 1000) for r in range(2)]
    assert all(np.array_equal(v, arrays[0] + arrays[1]) for _, v in run_job(server.port, "H", arrays, seq=1))
    assert server.wait_until(lambda stats: stats["connections"] == 0 and not stats["holders"], WAIT_S)


def test_link_pacing_takes_at_least_the_modeled_time(start_switch):
    gbps, count = 0.5, 1 << 20
    modeled = LATENCY_S + 4 * count * 8 / (2 * gbps * 1e9)  # 33.6 ms
    server = start_switch(link_gbps=gbps)
    arrays = [integers(r, count) for r in range(2)]
    began = time.monotonic()
    assert [status for status, _ in run_job(server.port, "A", arrays)] == ["done", "done"]
    elapsed = time.monotonic() - began
    (entry,) = server.log()
    assert entry["end"] - entry["start"] >= modeled - 1e-3
    assert elapsed >= modeled  # never faster than the link allows (slower: the machine's speed, not pacing)


def test_spatial_mode_admits_concurrent_jobs_sharing_the_link(start_switch):
    gbps, big, small = 0.25, 1 << 22, 1 << 18  # A's 16 MiB take 268 ms of link alone, B's 1 MiB 16.8 ms
    server = start_switch(mode="spatial", slots=2, link_gbps=gbps)
    with ThreadPoolExecutor(2) as pool:
        a0 = pool.submit(reduce_once, server.port, "A", 0, 2, integers(0, big))
        server.wait_until(holding("A"), WAIT_S)
        b0 = pool.submit(reduce_once, server.port, "B", 0, 2, integers(0, small))
        server.wait_until(holding("B"), WAIT_S)
        assert reduce_once(server.port, "C", 0, 1, integers(0, 10))[0] == "refused"  # both slots taken
        assert reduce_once(server.port, "B", 1, 2, integers(1, small))[0] == "done"
        assert reduce_once(server.port, "A", 1, 2, integers(1, big))[0] == "done"
        assert a0.result()[0] == b0.result()[0] == "done"
    entries = {e["job"]: e for e in server.log()}
    assert entries["A"]["start"] < entries["B"]["start"] < entries["B"]["end"] < entries["A"]["end"]
    alone = 4 * small * 8 / (2 * gbps * 1e9)
    assert entries["B"]["end"] - entries["B"]["start"] >= 2 * alone - 1e-3  # half the link while A transfers


def test_the_process_entry_point_serves_until_sigterm():
    process = subprocess.Popen([sys.executable, "-m", "tvmsched.runtime.collectives.switch", "--port", "0",
                                "--op-timeout", str(OP_TIMEOUT_S)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("switch listening on 127.0.0.1:"), (line, process.stderr.read())
        port = int(line.rsplit(":", 1)[1])
        arrays = [integers(r, 1000) for r in range(3)]
        assert all(np.array_equal(v, sum(arrays)) for _, v in run_job(port, "P", arrays))
        (entry,) = fetch_log(HOST, port)
        assert (entry["job"], entry["verdict"], entry["bytes"]) == ("P", "done", 4000)
        assert sorted(entry["ranks"]) == [0, 1, 2]
        assert query(HOST, port, {"op": "stats"})["stats"]["done"] == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=WAIT_S) == 0
    finally:
        process.kill()
        process.communicate()


def test_the_entry_point_rejects_bad_options_in_one_line(capsys):
    assert main(["--mode", "spatial", "--slots", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: slots 0")
    with SwitchServer() as server:
        assert main(["--port", str(server.port)]) == 2
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


def test_client_errors_are_connection_errors(start_switch):
    server = start_switch()
    with pytest.raises(ConnectionError, match="refused hello"):
        SwitchClient(HOST, server.port, "A", 2, 2)
    client = SwitchClient(HOST, server.port, "A", 0, 1)
    with pytest.raises(ValueError, match="float32"):
        client.reduce(0, np.zeros(4))
    server.stop()
    with pytest.raises(ConnectionError):
        client.reduce(0, np.zeros(4, np.float32))
    with pytest.raises(ConnectionError, match="closed"):
        client.reduce(1, np.zeros(4, np.float32))
    with pytest.raises(ConnectionError, match="cannot reach"):
        SwitchClient(HOST, server.port, "A", 0, 1)


def test_stopping_the_server_releases_a_waiting_rank(start_switch):
    server = start_switch(op_timeout_s=30)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(reduce_once, server.port, "A", 0, 2, integers(0, 10))
        server.wait_until(holding("A", "summed", rank=0), WAIT_S)
        server.stop()
        with pytest.raises(ConnectionError):
            waiting.result(timeout=WAIT_S)
