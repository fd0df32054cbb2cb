"""The shared controller (cluster control node): cluster state and mechanism E's consensus protocol.

Agents (one per rank) connect and say which job, rank, world size and switch they belong to; rank 0
of a job reports its measured profile. On every state change of the jobs sharing a switch (a job
complete or gone, a new or changed profile, a lease running out) the controller runs one round:

    prepare(r)  → every rank of those jobs takes its lock and replies prepared(r, seq)
    all of a job's seq equal, all replies in time → commit(r, state)   else → abort(r), retry later
    ranks apply (the state takes effect at the agreed seq), release the lock and confirm(r, outcome)

Timeouts everywhere: a rank that does not reply in `round_timeout_s` aborts the round; a rank that
hears neither commit nor abort settles the round through its job's own store (agent.py), so a lost or
late message never splits a job; a dead controller leaves agents on their last state until its lease
ends, then ring. The asyncio loop runs on its own thread (`start`) or in the foreground (`serve`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives import wire
from tvmsched.runtime.collectives.decision import POLICIES, JobState, Profile, SwitchState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Faults:
    """Injected message loss and delay on the controller's protocol messages (tests and benchmarks)."""

    drop: float = 0.0  # probability that a prepare/commit/abort is never sent
    delay_s: tuple[float, float] = (0.0, 0.0)  # each one is sent after a uniform delay in this range
    seed: int | None = None


@dataclass
class _Job:
    name: str
    world: int
    switch: str
    conns: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    profile: dict | None = None  # the last report of rank 0: profile, ref_seq, ref_time, ops_per_s
    agreed: JobState | None = None  # the entry its ranks last committed
    joined: float = field(default_factory=time.time)

    @property
    def complete(self) -> bool:
        return len(self.conns) == self.world


@dataclass
class _Switch:
    name: str
    jobs: dict[str, _Job] = field(default_factory=dict)
    version: int = 0
    owner: str | None = None
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class Controller:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, policy: str = "tdm", *,
                 round_timeout_s: float = 0.5, lease_s: float = 3.0, refresh_s: float = 1.0,
                 faults: Faults | None = None):
        if policy not in POLICIES:
            raise TvmschedError(f"unknown collectives policy {policy!r} (valid: {', '.join(POLICIES)})")
        self.host, self.port, self.policy = host, port, policy
        self.round_timeout_s, self.lease_s, self.refresh_s = round_timeout_s, lease_s, refresh_s
        self.faults = faults or Faults()
        self._rng = random.Random(self.faults.seed)
        self._switches: dict[str, _Switch] = {}
        self._waiting: dict[tuple, asyncio.Future] = {}  # (round, reply kind, job, rank) → its reply
        self._next_round = 0
        self.rounds: collections.deque[dict] = collections.deque(maxlen=10_000)  # the last rounds (tests, benchmarks)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    # -- life cycle ----------------------------------------------------------------------------------

    def start(self) -> int:
        """Serve on a background thread; returns the bound port."""
        self._thread = threading.Thread(target=self._run, name="tvmsched-controller", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._server is None:
            raise TvmschedError(f"controller could not listen on {self.host}:{self.port}")
        return self.port

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=5)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    async def _shutdown(self) -> None:
        self._server.close()
        for sw in self._switches.values():
            for job in sw.jobs.values():
                for w in job.conns.values():
                    w.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def serve(self, on_ready=None) -> None:
        """Serve in the foreground until interrupted (the CLI's controller command)."""
        asyncio.run(self._main(on_ready))

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._listen())
        except OSError as err:
            log.error("controller: %s", err)
        finally:
            self._ready.set()
        if self._server is not None:
            self._loop.run_forever()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._client, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _main(self, on_ready) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._listen()
        except OSError as err:
            raise TvmschedError(f"controller cannot listen on {self.host}:{self.port}: {err.strerror}") from None
        if on_ready:
            on_ready(self.port)
        async with self._server:
            await self._server.serve_forever()

    # -- connections -----------------------------------------------------------------------------------

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        job = rank = None
        try:
            hello, _ = await asyncio.wait_for(wire.read(reader), timeout=10)
            job, rank = self._hello(hello, writer)
            wire.write(writer, {"ok": True, "policy": self.policy})
            await writer.drain()
            while True:
                msg, _ = await wire.read(reader)
                self._message(job, rank, msg)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.TimeoutError):
            pass
        except (wire.ProtocolError, _BadHello, TypeError, ValueError, KeyError) as err:
            log.warning("controller: dropping a connection: %s", err)
            try:
                wire.write(writer, {"ok": False, "error": str(err)})
            except (ConnectionError, RuntimeError):
                pass
        finally:
            if job is not None:
                self._leave(job, rank, writer)
            writer.close()

    def _hello(self, msg: dict, writer) -> tuple[_Job, int]:
        if msg.get("op") != "hello":
            raise _BadHello("the first message must be hello")
        name, rank, world, switch = msg.get("job"), msg.get("rank"), msg.get("world"), msg.get("switch", "switch0")
        if not isinstance(name, str) or not name or not isinstance(switch, str):
            raise _BadHello("hello needs a job name and a switch name")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world)) or not 0 <= rank < world:
            raise _BadHello(f"hello needs integer rank in [0, world): rank={rank!r} world={world!r}")
        sw = self._switches.get(switch)
        if sw is None:
            sw = self._switches[switch] = _Switch(switch)
            sw.task = asyncio.get_running_loop().create_task(self._rounds(sw))
        job = sw.jobs.get(name)
        if job is None:
            job = sw.jobs[name] = _Job(name, world, switch)
        if job.world != world or rank in job.conns:
            raise _BadHello(f"job {name} rank {rank} of {world}: world size differs or rank already connected")
        job.conns[rank] = writer
        if job.complete:
            log.info("controller: job %s complete (%d ranks) on %s", name, world, switch)
            if self.policy == "exclusive" and sw.owner is None:
                sw.owner = name
            sw.dirty.set()
        return job, rank

    def _leave(self, job: _Job, rank: int, writer) -> None:
        if job.conns.get(rank) is not writer:
            return
        sw = self._switches[job.switch]
        del job.conns[rank]
        if sw.jobs.get(job.name) is job:
            del sw.jobs[job.name]  # a job that lost a rank is gone: its state leaves the switch
            log.info("controller: job %s left %s (rank %d disconnected)", job.name, sw.name, rank)
            for other_rank, w in list(job.conns.items()):
                job.conns.pop(other_rank)
                w.close()
            if sw.owner == job.name:
                sw.owner = next((j.name for j in sw.jobs.values() if j.complete), None)
            sw.dirty.set()

    def _message(self, job: _Job, rank: int, msg: dict) -> None:
        op = msg.get("op")
        if op in ("prepared", "confirm"):
            fut = self._waiting.get((msg.get("round"), op, job.name, rank))
            if fut is not None and not fut.done():
                fut.set_result(msg)
            elif op == "prepared":  # a late reply to a round that is over: tell the rank to let go
                self._send(job.conns.get(rank), {"op": "abort", "round": msg.get("round")}, faults=False)
        elif op == "profile" and rank == 0:
            try:  # a report that cannot become a state is the reporter's fault: drop its connection
                Profile.from_json(msg["profile"])
                int(msg.get("ref_seq", 0)), float(msg.get("ref_time", 0.0)), float(msg.get("ops_per_s") or 0.0)
            except (TypeError, ValueError, KeyError, AttributeError, TvmschedError) as err:
                raise wire.ProtocolError(f"job {job.name}: bad profile report ({err})") from None
            first = job.profile is None
            job.profile = msg
            if first or msg.get("changed"):
                self._switches[job.switch].dirty.set()
        elif op != "profile":
            raise wire.ProtocolError(f"unknown message {op!r}")

    # -- rounds ----------------------------------------------------------------------------------------

    async def _rounds(self, sw: _Switch) -> None:
        while True:
            try:
                await asyncio.wait_for(sw.dirty.wait(), timeout=self.refresh_s)
            except asyncio.TimeoutError:
                pass
            if not any(j.complete for j in sw.jobs.values()):
                sw.dirty.clear()
                continue
            sw.dirty.clear()
            try:
                ok = await self._round(sw)
            except Exception:  # noqa: BLE001 - a bug must not stop the switch's rounds for good
                log.exception("controller: round on %s failed", sw.name)
                ok = False
            if not ok:
                sw.dirty.set()
                await asyncio.sleep(self._rng.uniform(0.01, 0.05))  # retry later

    async def _round(self, sw: _Switch) -> bool:
        """One round over the complete jobs on `sw`. A job whose ranks replied in time with one sequence
        number gets the new state; any other job gets abort and keeps its state (its entry in the new
        state is the one it keeps, so the others predict it as it behaves). True if every job committed."""
        rid = self._next_round
        self._next_round += 1
        t0 = time.perf_counter()
        members = [(j, r, w) for j in sw.jobs.values() if j.complete for r, w in j.conns.items()]
        record = {"round": rid, "switch": sw.name, "jobs": sorted({j.name for j, _, _ in members}), "start": time.time()}
        replies = await self._ask(rid, "prepared", members, {"op": "prepare", "round": rid})
        seqs: dict[str, set[int]] = {}
        for (job, _, _), reply in zip(members, replies):
            seq = reply.get("seq") if isinstance(reply, dict) else None
            seqs.setdefault(job.name, set()).add(seq if isinstance(seq, int) and not isinstance(seq, bool) else -1)
        agreed = {name: next(iter(s)) for name, s in seqs.items() if len(s) == 1 and -1 not in s}
        why = {name: "missing reply" if -1 in s else "sequence numbers differ" for name, s in seqs.items() if name not in agreed}
        for job, _, w in members:
            if job.name not in agreed:
                self._send(w, {"op": "abort", "round": rid})
        if not agreed:
            self.rounds.append({**record, "outcome": "abort", "why": why, "seconds": time.perf_counter() - t0})
            return False
        sw.version += 1
        state = self._state(sw, agreed)
        committing = [m for m in members if m[0].name in agreed]
        confirms = await self._ask(rid, "confirm", committing, {"op": "commit", "round": rid, "state": state.to_json()})
        outcomes = {}
        for (job, _, _), c in zip(committing, confirms):
            outcomes.setdefault(job.name, set()).add(c.get("outcome") if isinstance(c, dict) else None)
        for job in sw.jobs.values():
            if outcomes.get(job.name) == {"commit"}:
                job.agreed = state.job(job.name)
        ok = not why and all(o == {"commit"} for o in outcomes.values())
        self.rounds.append({**record, "outcome": "commit" if ok else "partial", "version": sw.version, "seqs": agreed,
                            "aborted": why, "seconds": time.perf_counter() - t0})
        return ok

    async def _ask(self, rid: int, reply: str, members, msg: dict) -> list:
        loop = asyncio.get_running_loop()
        futs = []
        for job, rank, w in members:
            fut = self._waiting[(rid, reply, job.name, rank)] = loop.create_future()
            futs.append(fut)
            self._send(w, msg)
        done, _ = await asyncio.wait(futs, timeout=self.round_timeout_s) if futs else (set(), set())
        for job, rank, _ in members:
            self._waiting.pop((rid, reply, job.name, rank), None)
        return [f.result() if f in done else None for f in futs]

    def _send(self, writer, msg: dict, faults: bool = True) -> None:
        if writer is None or writer.is_closing():
            return
        f = self.faults
        if faults and f.drop and self._rng.random() < f.drop:
            return
        delay = self._rng.uniform(*f.delay_s) if faults and f.delay_s[1] > 0 else 0.0
        if delay:
            asyncio.get_running_loop().call_later(delay, self._write, writer, msg)
        else:
            self._write(writer, msg)

    @staticmethod
    def _write(writer, msg: dict) -> None:
        if not writer.is_closing():
            wire.write(writer, msg)

    def _state(self, sw: _Switch, seqs: dict[str, int]) -> SwitchState:
        """The new state: the jobs in `seqs` take effect from their agreed seq for `lease_s` of their
        AllReduces; every other complete job keeps the entry it last agreed to."""
        jobs = []
        for name, job in sorted(sw.jobs.items()):
            if name not in seqs:
                if job.agreed is not None:
                    jobs.append(job.agreed)
                continue
            seq, rep = seqs[name], job.profile or {}
            rate = float(rep.get("ops_per_s") or 0.0)
            lease = max(64, math.ceil(rate * self.lease_s)) if rate > 0 else 1024
            jobs.append(JobState(job=name, profile=Profile.from_json(rep["profile"]) if rep else None, ref_seq=int(rep.get("ref_seq", 0)),
                                 ref_time=float(rep.get("ref_time", 0.0)), eff_seq=seq, lease_seq=seq + lease - 1))
        return SwitchState(version=sw.version, policy=self.policy, jobs=tuple(jobs), owner=sw.owner)


class _BadHello(Exception):
    pass
