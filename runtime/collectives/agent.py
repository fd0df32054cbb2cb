"""The per-rank agent (mechanism E's node side): a job's AllReduces through one queue, one at a time.

`Agent.all_reduce(tensor)` (and the DDP communication hook `ddp_hook`) does not put the collective on
the process group at once: it appends a request to the agent's queue. Only one collective is in
flight; when it completes, its completion callback (the Gloo/NCCL work's future, or the switch
client's reply) takes the next request, decides in-network or ring (`decision.decide`, from the
state the controller's last agreed round installed), and launches it. A request that does not get the
switch runs as the process group's own ring/tree AllReduce at once; one that the switch refuses or
aborts (its one slot was taken after all, a rank died) falls back to ring for every rank of the job
alike, because the switch answers all ranks of an operation the same.

The agent takes part in the controller's consensus rounds on a thread of its own: on prepare(r) it
takes the launch lock and replies with its sequence number (AllReduces launched so far); the round's
outcome is settled in the job's own store with one compare-and-set per rank (the first writer wins),
so a rank that missed the commit or the abort, or whose controller died, still ends the round exactly
as its peers did: commit → apply the state from the agreed seq, abort/timeout → keep the old one.
"""

import collections
import datetime
import heapq
import json
import logging
import queue
import random
import socket
import threading
import time
from dataclasses import asdict, dataclass, field

from tvmsched.errors import TvmschedError
from tvmsched.extras import require
from tvmsched.runtime.collectives import wire
from tvmsched.runtime.collectives.decision import Profile, SwitchState, decide
from tvmsched.runtime.collectives.workloads import LATENCY_S, transfer_s

require("collectives", "the collectives' agent (torch.distributed)")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

log = logging.getLogger(__name__)


@dataclass
class _Request:
    tensor: torch.Tensor
    future: torch.futures.Future
    ready: float  # time.time() when handed to the agent
    last: bool  # the last AllReduce of a training step
    seq: int = -1
    queued: bool = False  # another request was ahead of it when it was handed over
    version: int = 0  # the state it was decided under ...
    innet: bool = False  # ... and the decision
    started: float = 0.0
    path: str = ""


@dataclass
class _Step:
    """Measurements of the current training step (for the profile rank 0 reports)."""

    first_seq: int = -1
    origin: float = 0.0  # time.time() when its first AllReduce was ready
    ready: list[float] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    ring_s: list[float] = field(default_factory=list)
    innet_s: list[float] = field(default_factory=list)


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise TvmschedError(f"address {addr!r} is not HOST:PORT")
    return host, int(port)


class Agent:
    """One rank's AllReduce agent. `group`: the job's process group (ring path; default: the world).
    `controller`, `switch`: "HOST:PORT" of the shared controller and of the aggregation service
    (without a controller every AllReduce runs ring). `steps`: the job's training steps, if known
    (CalcScore favours jobs near their end). `link_gbps`: emulate a cluster link on one machine — a
    ring AllReduce is not finished before 50 µs + bytes / link rate (the switch paces its own side).
    `history`: how many of the last AllReduces' decisions `decisions` keeps. `drop_replies`, `seed`:
    lose that fraction of this rank's protocol replies (fault injection for tests)."""

    def __init__(self, job: str, *, group=None, controller: str | None = None, switch: str | None = None,
                 switch_name: str = "switch0", store=None, steps: int | None = None, link_gbps: float | None = None,
                 lock_timeout_s: float = 1.0, report_s: float = 0.5, history: int = 100_000,
                 drop_replies: float = 0.0, seed: int | None = None):
        self.job, self.group = job, group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.steps, self.link_gbps = steps, link_gbps
        self.lock_timeout_s, self.report_s = lock_timeout_s, report_s
        self._mu = threading.Lock()  # guards the queue, the in-flight request, the lock flag and the state
        self._pending: collections.deque[_Request] = collections.deque()
        self._inflight: _Request | None = None
        self._locked = False
        self._pumping = threading.local()
        self._seq = 0  # AllReduces launched so far (the next one's sequence number)
        self._state = SwitchState()
        self._broken: BaseException | None = None
        # the last `history` AllReduces: (seq, state version, in-network?, final path), in seq order
        self.decisions: collections.deque[tuple[int, int, bool, str]] = collections.deque(maxlen=history)
        self._paths: collections.Counter = collections.Counter()  # final paths of every AllReduce
        self.rounds: list[tuple[int, str, int]] = []  # (round, outcome, seq)
        self._launch_times: collections.deque[tuple[float, float, bool]] = collections.deque(maxlen=history)
        self._step = _Step()
        self._steps_done = 0
        self._last_step_bytes: list[int] = []
        self._last_report = 0.0
        self._prev_origin = 0.0
        self._stop = threading.Event()
        self._rng = random.Random(seed)
        self._drop_replies = drop_replies
        self._switch_addr = _host_port(switch) if switch else None
        self._switch_jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._switch_client = None
        self._threads: list[threading.Thread] = []
        if self._switch_addr:
            self._spawn(self._switch_loop, "switch")
        self._pacer = _Pacer() if link_gbps else None
        self._ctl: socket.socket | None = None
        self._ctl_send = threading.Lock()
        if controller:
            self._store = _job_store(store, job, lock_timeout_s)
            self._ctl_addr = _host_port(controller)
            self._switch_name = switch_name
            self._spawn(self._control_loop, "control")

    def _spawn(self, fn, what: str) -> None:
        t = threading.Thread(target=fn, name=f"tvmsched-agent-{what}", daemon=True)
        self._threads.append(t)
        t.start()

    # -- the queue -----------------------------------------------------------------------------------------

    def all_reduce(self, tensor: torch.Tensor, last: bool = False) -> torch.futures.Future:
        """Sum `tensor` over the job's ranks, in place; the future completes with it. `last`: this is
        the step's last AllReduce (DDP's last bucket), which closes the step's profile."""
        req = _Request(tensor, torch.futures.Future(), time.time(), last)
        with self._mu:
            if self._broken is not None:
                req.future.set_exception(self._broken)
                return req.future
            req.queued = self._inflight is not None or bool(self._pending) or self._locked
            self._pending.append(req)
        self._pump()
        return req.future

    def _pump(self) -> None:
        """Launch queued requests while none is in flight. A launch may complete at once and call back
        into `_pump` on this thread: that call returns and this loop goes on (no recursion)."""
        if getattr(self._pumping, "on", False):
            self._pumping.again = True
            return
        self._pumping.on = True
        try:
            while True:
                self._pumping.again = False
                with self._mu:
                    if self._inflight is not None or self._locked or not self._pending:
                        return
                    req = self._inflight = self._pending.popleft()
                    req.seq, self._seq = self._seq, self._seq + 1
                    state = self._state
                self._launch(req, state)
                if not self._pumping.again and self._inflight is req:
                    return
        finally:
            self._pumping.on = False

    def _launch(self, req: _Request, state: SwitchState) -> None:
        d = decide(state, self.job, req.seq)
        req.started = time.time()
        self._launch_times.append((req.started, req.ready, req.queued))
        req.version, req.innet = state.version, d.innet
        if d.innet and self._switch_addr is not None and req.tensor.dtype == torch.float32 and req.tensor.is_contiguous():
            req.path = "innet"
            self._switch_jobs.put(req)
        else:
            self._ring(req, "ring")

    def _ring(self, req: _Request, path: str) -> None:
        req.path = path
        try:
            work = dist.all_reduce(req.tensor, group=self.group, async_op=True)
        except Exception as err:  # noqa: BLE001 - the process group is broken (a peer died): fail, never hang
            self._finish(req, err)
            return
        if self._pacer is not None:
            nbytes = req.tensor.numel() * req.tensor.element_size()
            due = req.started + transfer_s(nbytes, self.world, self.link_gbps * 1e9 / 8, LATENCY_S)
            work.get_future().add_done_callback(lambda f: self._pacer.at(due, self._finish_work, req, f))
        else:
            work.get_future().add_done_callback(lambda f: self._finish_work(req, f))

    def _finish_work(self, req: _Request, fut) -> None:
        try:
            fut.wait()
        except Exception as err:  # noqa: BLE001
            self._finish(req, err)
            return
        self._finish(req, None)

    def _finish(self, req: _Request, err: BaseException | None) -> None:
        elapsed = time.time() - req.started
        self.decisions.append((req.seq, req.version, req.innet, req.path))  # one in flight: finishes in seq order
        self._paths[req.path] += 1
        with self._mu:
            self._inflight = None
            if err is not None:
                self._broken = err
                failed, self._pending = list(self._pending), collections.deque()
        if err is None:
            self._measure(req, elapsed)
            self._pump()  # the next collective first: the queue never idles on a user callback
            req.future.set_result(req.tensor)
        else:
            for r in [req, *failed]:
                r.future.set_exception(err)

    # -- the in-network path (the switch client runs on its own thread) ---------------------------------

    def _switch_loop(self) -> None:
        from tvmsched.runtime.collectives.switch import SwitchClient
        while not self._stop.is_set():
            req = self._switch_jobs.get()
            if req is None:
                return
            try:
                if self._switch_client is None:
                    self._switch_client = SwitchClient(*self._switch_addr, job=self.job, rank=self.rank, world=self.world)
                flat = req.tensor.detach().view(-1)
                host = flat if flat.device.type == "cpu" else flat.cpu()  # (a GPU tensor goes through host memory)
                arr = host.numpy()
                verdict, result = self._switch_client.reduce(req.seq, arr, out=arr)  # the sum lands in place
                if verdict == "done" and host is not flat:
                    flat.copy_(host)
            except Exception as err:  # noqa: BLE001 - unreachable, or anything else: this AllReduce runs ring, never hangs
                log.warning("agent %s/%d: switch failed (%s); AllReduce %d runs ring", self.job, self.rank, err, req.seq)
                if self._switch_client is not None:
                    self._switch_client.close()
                self._switch_client = None
                verdict = "aborted"
            if verdict == "done":
                self._finish(req, None)
            else:
                self._ring(req, f"{verdict}->ring")

    # -- measurements and reports ------------------------------------------------------------------------

    def _measure(self, req: _Request, elapsed: float) -> None:
        st = self._step
        if st.first_seq < 0:
            st.first_seq, st.origin = req.seq, req.ready
        st.ready.append(req.ready - st.origin)
        st.nbytes.append(req.tensor.numel() * req.tensor.element_size())
        # the path not taken is modeled as SHARP's: in-network twice as fast as ring
        ring, innet = (elapsed * 2, elapsed) if req.path == "innet" else (elapsed, elapsed / 2)
        st.ring_s.append(ring)
        st.innet_s.append(innet)
        if req.last:
            self._close_step(st)

    def _close_step(self, st: _Step) -> None:
        """Rank 0 reports the step's profile, anchored one period later (where the next step starts)."""
        self._step = _Step()
        self._steps_done += 1
        self._last_step_bytes = st.nbytes
        step_s, self._prev_origin = st.origin - self._prev_origin, st.origin
        if self.rank != 0 or self._ctl is None or self._steps_done < 2:
            return
        if self._steps_done > 2 and time.time() - self._last_report < self.report_s:
            return
        self._last_report = time.time()
        steps_left = None if self.steps is None else max(self.steps - self._steps_done, 0)
        try:
            prof = Profile.measured(step_s, st.ready, st.nbytes, st.ring_s, st.innet_s, hosts=self.world, steps_left=steps_left)
        except TvmschedError:  # a step too short to time (the clock did not move): report the next one
            return
        self._send_ctl({"op": "profile", "profile": asdict(prof), "ref_seq": st.first_seq + len(st.ready),
                        "ref_time": st.origin + step_s, "ops_per_s": len(st.ready) / max(step_s, 1e-6),
                        "changed": self._steps_done == 2})

    # -- the consensus protocol --------------------------------------------------------------------------

    def _send_ctl(self, msg: dict) -> None:
        sock = self._ctl
        if sock is None:
            return
        try:
            with self._ctl_send:
                wire.send(sock, msg)
        except OSError:
            pass

    def _control_loop(self) -> None:
        while not self._stop.is_set():
            try:
                sock = socket.create_connection(self._ctl_addr, timeout=2)
                wire.send(sock, {"op": "hello", "job": self.job, "rank": self.rank, "world": self.world,
                                 "switch": self._switch_name})
                reply, _ = wire.recv(sock)
                if not reply.get("ok"):
                    log.error("agent %s/%d: controller refused: %s", self.job, self.rank, reply.get("error"))
                    return
                sock.settimeout(None)
                self._ctl = sock
                self._serve_controller(sock)
            except (OSError, ConnectionError, wire.ProtocolError) as err:
                log.info("agent %s/%d: controller connection: %s", self.job, self.rank, err)
            self._ctl = None
            self._stop.wait(0.5)  # reconnect: the state is agreed again once the controller is back

    def _serve_controller(self, sock: socket.socket) -> None:
        pending: int | None = None  # the round we are locked for
        deadline = 0.0
        while not self._stop.is_set():
            sock.settimeout(max(deadline - time.time(), 0.001) if pending is not None else None)
            try:
                msg, _ = wire.recv(sock)
            except socket.timeout:
                self._settle(pending, "abort", None)  # neither commit nor abort in time
                pending = None
                continue
            except (OSError, ConnectionError) as err:
                if pending is not None:
                    self._settle(pending, "abort", None)
                raise ConnectionError("controller connection lost") from err
            op, rid = msg.get("op"), msg.get("round")
            if op == "prepare":
                if pending is not None:  # a newer round while an older one is unsettled
                    self._settle(pending, "abort", None)
                with self._mu:
                    self._locked = True
                    seq = self._seq
                pending, deadline = rid, time.time() + self.lock_timeout_s
                self._reply({"op": "prepared", "round": rid, "seq": seq})
            elif op in ("commit", "abort") and rid == pending:
                self._settle(rid, op, msg.get("state"))
                pending = None

    def _reply(self, msg: dict) -> None:
        if self._drop_replies and self._rng.random() < self._drop_replies:
            return
        self._send_ctl(msg)

    def _settle(self, rid: int, proposed: str, state_json: dict | None) -> None:
        """End round `rid` as the job's store says: the first rank of the job to settle it writes the
        outcome, every other rank reads that one. A rank that commits first leaves the state in the
        store, so a rank that never received the commit applies the same state."""
        try:
            if state_json is not None:
                self._store.set(f"state/{rid}", json.dumps(state_json))
            outcome = self._store.compare_set(f"round/{rid}", "", proposed).decode()
            if outcome == "commit" and state_json is None:
                state_json = json.loads(self._store.get(f"state/{rid}"))
        except Exception as err:  # noqa: BLE001 - the job's store is gone: its job is dying anyway
            log.warning("agent %s/%d: store unreachable (%s): round %s aborted here", self.job, self.rank, err, rid)
            outcome, state_json = "abort", None
        with self._mu:
            seq = self._seq
            if outcome == "commit":
                self._state = SwitchState.from_json(state_json)
            self._locked = False
        self.rounds.append((rid, outcome, seq))
        self._reply({"op": "confirm", "round": rid, "outcome": outcome})
        self._pump()

    # -- life cycle --------------------------------------------------------------------------------------

    def close(self) -> None:
        self._stop.set()
        self._switch_jobs.put(None)
        if self._ctl is not None:
            try:
                self._ctl.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._switch_client is not None:
            self._switch_client.close()
        if self._pacer is not None:
            self._pacer.close()

    @property
    def state(self) -> SwitchState:
        return self._state

    def install(self, state: SwitchState) -> None:
        """Apply `state` without a controller (every rank of the job must install the same one before
        its first AllReduce): benchmarks and a fixed schedule. With a controller, rounds install it."""
        with self._mu:
            self._state = state

    def overheads(self) -> list[float]:
        """Seconds from handing each AllReduce to the agent to launching it, for those that found the
        queue empty (the agent's own cost: queue, decision, bookkeeping; not waiting behind another)."""
        return [s - r for s, r, queued in self._launch_times if not queued]

    def stats(self) -> dict:
        return {"job": self.job, "rank": self.rank, "allreduces": sum(self._paths.values()), "paths": dict(self._paths),
                "rounds": len(self.rounds), "version": self._state.version, "step_bytes": self._last_step_bytes}


def ddp_hook(agent: "Agent", bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: `model.register_comm_hook(agent, ddp_hook)` sends every gradient bucket
    through the agent (averaged over the job's ranks, as DDP's default hook does)."""
    world = agent.world
    return agent.all_reduce(bucket.buffer(), last=bucket.is_last()).then(lambda f: f.value().div_(world))


def _job_store(store, job: str, timeout_s: float):
    """A client of the job's own TCPStore (the one its process group rendezvoused through), with this
    agent's timeout and a key prefix of its own."""
    if store is None:
        store = dist.distributed_c10d._get_default_store()
    base = store
    while isinstance(base, dist.PrefixStore):
        base = base.underlying_store
    if isinstance(base, dist.TCPStore):
        base = dist.TCPStore(base.host, base.port, is_master=False, timeout=datetime.timedelta(seconds=max(timeout_s * 5, 5)),
                             wait_for_workers=False)
    return dist.PrefixStore(f"tvmsched/collectives/{job}/", base)


class _Pacer:
    """Finishes emulated-link AllReduces at their due time (one timer thread, no sleeps in callbacks)."""

    def __init__(self):
        self._cv = threading.Condition()
        self._heap: list = []
        self._n = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tvmsched-agent-pacer", daemon=True)
        self._thread.start()

    def at(self, due: float, fn, *args) -> None:
        with self._cv:
            self._n += 1
            heapq.heappush(self._heap, (due, self._n, fn, args))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._heap[0][0] > time.time()):
                    self._cv.wait(None if not self._heap else self._heap[0][0] - time.time())
                if self._closed:
                    return
                _, _, fn, args = heapq.heappop(self._heap)
            fn(*args)

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()


_default: Agent | None = None


def init(job: str, **kwargs) -> Agent:
    """Create this process's agent (after `torch.distributed.init_process_group`)."""
    global _default
    _default = Agent(job, **kwargs)
    return _default


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """Drop-in for `torch.distributed.all_reduce` through this process's agent (SUM only; other ops,
    other groups and no agent go straight to torch.distributed)."""
    agent = _default
    if agent is None or op != dist.ReduceOp.SUM or group not in (None, agent.group):
        return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)
    fut = agent.all_reduce(tensor)
    if async_op:
        return fut
    fut.wait()
    return None

