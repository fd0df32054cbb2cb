"""The aggregation service that plays an in-network-aggregation switch (mechanism E) where no SHARP is.

A rank connects, says `{"op":"hello","job":J,"rank":r,"world":W}` (→ `{"ok":true}`), then sends one
`{"op":"reduce","job":J,"seq":s,"dtype":"float32","count":n}` + n float32 per AllReduce and gets
`{"status":"done"}` + the elementwise sum over the job's W ranks, `{"status":"refused","holder":K}` or
`{"status":"aborted","reason":...}`. `{"op":"log","start":i}` → `{"log":[...],"next":j}` pages the
finished operations; `{"op":"stats"}` → `{"stats":{...}}`. A bad message → `{"ok":false,"error":...}`
and the connection is closed.

Mode `tdm` has one aggregation slot, as a Quantum switch: the first arrival of (J, s) while it is free
takes it; another op arriving meanwhile is refused at once, never queued. Every rank of (J, s) gets
the same verdict: the verdict is remembered until all W ranks have arrived. An op whose W payloads do
not all arrive within `op_timeout_s` of its first arrival, whose ranks disagree (count, world), or one
of whose ranks closes its connection before the sum is complete, is aborted and frees the slot. Mode
`spatial` (an ATP-like baseline) admits up to `slots` ops at once, sharing the link equally.

With `link_gbps`, replies wait for the modeled in-network time: 50 µs + nbytes·8 / (2·link_gbps·1e9)
from the first arrival (SHARP moves each byte once, twice as fast as a ring), the link shared equally
among the ops transferring at once (processor sharing; in `tdm` one op has it alone). Sums are taken
in arrival order, chunk by chunk as payloads stream in.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives import wire
from tvmsched.runtime.collectives.workloads import LATENCY_S

logger = logging.getLogger(__name__)

MODES = ("tdm", "spatial")
CHUNK = 1 << 20  # payload bytes read, summed or written at a time
LINGER_S = 60.0  # at least this long a refused or aborted verdict is remembered for late ranks
LOG_LIMIT = 1 << 18  # finished operations kept (the oldest half is dropped past it)
LOG_PAGE = 1024  # entries per `log` reply (keeps the JSON header under wire.MAX_HEADER)
MAX_WORLD = 1 << 16
MAX_SEQ = (1 << 63) - 1
MAX_JOB_NAME = 256


@dataclass(frozen=True)
class NetworkSwitchOptions:
    """How the emulated switch aggregates."""

    mode: str = "tdm"
    """`tdm` (one op at a time, others refused) or `spatial` (up to `slots` ops at once)."""
    slots: int = 1
    """Ops aggregated at once in `spatial` mode; `tdm` has exactly one."""
    link_gbps: float | None = None
    """Emulated link rate; None sends replies as soon as the sums are done."""
    op_timeout_s: float = 2.0
    """An op not complete this long after its first arrival is aborted."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TvmschedError(f"unknown switch mode {self.mode!r}; valid modes: {', '.join(MODES)}")
        if not isinstance(self.slots, int) or self.slots < 1 or (self.mode == "tdm" and self.slots != 1):
            raise TvmschedError(f"slots {self.slots!r}: tdm has 1, spatial a positive number")
        if self.link_gbps is not None and not self.link_gbps > 0:
            raise TvmschedError(f"link rate {self.link_gbps!r} Gbit/s is not positive")
        if not self.op_timeout_s > 0:
            raise TvmschedError(f"op timeout {self.op_timeout_s!r} s is not positive")


@dataclass(eq=False)
class _Op:
    """One AllReduce (job, seq) from its first arrival until its verdict reached every rank."""

    job: str | int
    seq: int
    world: int
    count: int
    first: float  # loop time of the first arrival
    entry: dict  # its log entry
    verdict: str | None = None  # None while aggregating, then done | refused | aborted
    detail: object = None  # refused: the holder's job; aborted: the reason
    acc: np.ndarray | None = None
    arrived: set[int] = field(default_factory=set)
    summed: set[int] = field(default_factory=set)
    modeled_at: float | None = None  # loop time before which no reply leaves (None: still transferring)
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    decided: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def key(self) -> tuple[str | int, int]:
        return self.job, self.seq

    @property
    def complete(self) -> bool:
        return len(self.summed) == self.world

    def mismatch(self, rank: int, world: int, count: int) -> str | None:
        if world != self.world:
            return f"rank {rank} says world {world}, an earlier rank {self.world}"
        if count != self.count:
            return f"rank {rank} sent {count} elements, an earlier rank {self.count}"
        if rank in self.arrived:
            return f"rank {rank} sent seq {self.seq} twice"
        return None


class _Link:
    """The emulated switch link, shared equally by the ops transferring at once (processor sharing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, gbps: float, on_done: Callable[[_Op], None]):
        self._loop, self._on_done = loop, on_done
        self._rate = 2 * gbps * 1e9 / 8  # bytes/s: in-network aggregation moves each byte once (2x a ring)
        self._left: dict[_Op, float] = {}  # op -> seconds of transfer left at the full rate
        self._timers: dict[_Op, asyncio.TimerHandle] = {}
        self._clock = loop.time()

    def add(self, op: _Op, nbytes: int) -> None:
        self._advance()
        self._left[op] = nbytes / self._rate
        self._plan()

    def remove(self, op: _Op) -> None:
        if op in self._left:
            self._advance()
            del self._left[op]
            self._timers.pop(op).cancel()
            self._plan()

    def _advance(self) -> None:
        now = self._loop.time()
        for op in self._left:
            self._left[op] -= (now - self._clock) / len(self._left)
        self._clock = now

    def _plan(self) -> None:
        for op, left in self._left.items():
            if op in self._timers:
                self._timers[op].cancel()
            self._timers[op] = self._loop.call_at(self._clock + max(left, 0.0) * len(self._left), self._finish, op)

    def _finish(self, op: _Op) -> None:
        self.remove(op)
        self._on_done(op)


class _Switch:
    """Slots, sums and verdicts; no I/O. Lives on the event loop's thread."""

    def __init__(self, options: NetworkSwitchOptions, on_change: Callable[[dict], None] | None = None):
        self.options = options
        self.connections = 0
        self._loop = asyncio.get_running_loop()
        self._link = _Link(self._loop, options.link_gbps, self._paced) if options.link_gbps else None
        self._ops: dict[tuple, _Op] = {}  # ops some of whose ranks may still arrive
        self._holders: dict[tuple, _Op] = {}  # ops holding an aggregation slot
        self._log: list[dict] = []
        self._log_dropped = 0
        self._counts = {"done": 0, "refused": 0, "aborted": 0, "bytes": 0}
        self._on_change = on_change
        self._linger_s = max(LINGER_S, 10 * options.op_timeout_s)

    def arrive(self, job: str | int, seq: int, rank: int, world: int, count: int) -> _Op:
        """A rank's reduce header came: the op, its verdict already set when refused or aborted."""
        op = self._ops.get((job, seq)) or self._open(job, seq, world, count)
        problem = op.mismatch(rank, world, count) if op.verdict is None else None
        if problem and op.complete:
            raise wire.ProtocolError(problem)
        if problem:
            self.abort(op, problem)
        if rank not in op.arrived:
            op.arrived.add(rank)
            op.entry["ranks"].append(rank)
        self._forget_if_all_arrived(op)
        self.changed()
        return op

    def add(self, op: _Op, offset: int, data: bytes) -> None:
        """Sum a chunk of a rank's payload (bytes from `offset`) into the op, unless it is decided."""
        if op.verdict is None:
            part = op.acc[offset // 4: (offset + len(data)) // 4]
            np.add(part, np.frombuffer(data, np.float32), out=part)

    def received(self, op: _Op, rank: int) -> None:
        """A rank's whole payload is in the sum."""
        if op.verdict is None:
            op.summed.add(rank)
            self.changed()
            if op.complete:
                self._release_when_modeled(op)

    def abort(self, op: _Op, reason: str) -> None:
        """Abort an op still aggregating (its ranks get `aborted`); a complete or decided op is kept."""
        if op.verdict is not None or op.complete:
            return
        logger.info("switch: job %s seq %s aborted: %s", op.job, op.seq, reason)
        self._free(op)
        op.acc = None
        self._decide(op, "aborted", reason)
        self._linger(op)

    def abort_key(self, key: tuple, reason: str) -> None:
        if key in self._ops:
            self.abort(self._ops[key], reason)

    def stats(self) -> dict:
        holders = [{"job": op.job, "seq": op.seq, "arrived": sorted(op.arrived), "summed": sorted(op.summed)}
                   for op in self._holders.values()]
        return {"mode": self.options.mode, "slots": self.options.slots, "holders": holders,
                "open": len(self._ops), "connections": self.connections, **self._counts}

    def log_page(self, start: int, limit: int) -> tuple[list[dict], int]:
        """Entries from the `start`-th finished op on (fewer when dropped), and the index after them."""
        low = max(start - self._log_dropped, 0)
        page = [dict(entry, ranks=list(entry["ranks"])) for entry in self._log[low: low + limit]]
        return page, self._log_dropped + low + len(page)

    def changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self.stats())

    def _open(self, job: str | int, seq: int, world: int, count: int) -> _Op:
        entry = {"job": job, "seq": seq, "start": time.time(), "end": None, "verdict": None,
                 "bytes": 4 * count, "ranks": []}
        op = self._ops[(job, seq)] = _Op(job, seq, world, count, self._loop.time(), entry)
        if len(self._holders) >= self.options.slots:
            self._decide(op, "refused", next(iter(self._holders.values())).job)
            self._linger(op)
            return op
        self._holders[op.key] = op
        op.acc = np.zeros(count, np.float32)
        op.timers.append(self._loop.call_later(self.options.op_timeout_s, self._expire, op))
        if self._link is None:
            op.modeled_at = op.first
        else:
            self._link.add(op, 4 * count)
        return op

    def _expire(self, op: _Op) -> None:
        self.abort(op, f"timeout: {len(op.summed)} of {op.world} ranks within {self.options.op_timeout_s} s")

    def _paced(self, op: _Op) -> None:
        op.modeled_at = self._loop.time() + LATENCY_S
        if op.complete:
            self._release_when_modeled(op)

    def _release_when_modeled(self, op: _Op) -> None:
        if op.modeled_at is None:
            return  # the link calls _paced when the modeled transfer ends
        if op.modeled_at > self._loop.time():
            op.timers.append(self._loop.call_at(op.modeled_at, self._release, op))
        else:
            self._release(op)

    def _release(self, op: _Op) -> None:
        if op.verdict is None:
            self._free(op)
            self._forget(op)
            self._counts["bytes"] += 4 * op.count
            self._decide(op, "done", None)

    def _free(self, op: _Op) -> None:
        if self._holders.get(op.key) is op:
            del self._holders[op.key]
        if self._link is not None:
            self._link.remove(op)
        for timer in op.timers:
            timer.cancel()

    def _decide(self, op: _Op, verdict: str, detail: object) -> None:
        op.verdict, op.detail = verdict, detail
        op.entry.update(verdict=verdict, end=time.time())
        self._counts[verdict] += 1
        self._log.append(op.entry)
        if len(self._log) > LOG_LIMIT:
            del self._log[: LOG_LIMIT // 2]
            self._log_dropped += LOG_LIMIT // 2
        op.decided.set()
        self.changed()

    def _linger(self, op: _Op) -> None:
        self._loop.call_later(self._linger_s, self._forget, op)

    def _forget_if_all_arrived(self, op: _Op) -> None:
        if op.verdict is not None and len(op.arrived) >= op.world:
            self._forget(op)

    def _forget(self, op: _Op) -> None:
        if self._ops.get(op.key) is op:
            del self._ops[op.key]


@dataclass
class _Session:
    """What a connection said in its hello."""

    peer: object
    job: str | int | None = None
    rank: int = 0
    world: int = 0


class _Service:
    """The switch's TCP front: one asyncio task per connection, speaking wire.py messages."""

    def __init__(self, options: NetworkSwitchOptions, on_change: Callable[[dict], None] | None = None):
        self.switch = _Switch(options, on_change)
        self._connections: dict[asyncio.Task, asyncio.StreamWriter] = {}
        self._handlers = {"hello": self._hello, "reduce": self._reduce, "log": self._log, "stats": self._stats}

    async def run(self, host: str, port: int, stop: asyncio.Event, on_ready: Callable[[int], None]) -> None:
        """Serve until `stop` is set; `on_ready(port)` once listening."""
        try:
            server = await asyncio.start_server(self._connection, host, port, limit=CHUNK)
        except OSError as err:
            raise TvmschedError(f"the switch cannot listen on {host}:{port}: {err.strerror or err}") from None
        self.switch.changed()
        on_ready(server.sockets[0].getsockname()[1])
        await stop.wait()
        server.close()
        for writer in self._connections.values():
            writer.transport.abort()
        await server.wait_closed()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections[task] = writer
        self.switch.connections += 1
        self.switch.changed()
        writer.transport.set_write_buffer_limits(high=4 * CHUNK)
        session = _Session(writer.get_extra_info("peername"))
        try:
            while True:
                await self._dispatch(session, await wire.read_header(reader), reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except wire.ProtocolError as err:
            logger.warning("switch: closing %s: %s", session.peer, err)
            await _send_quietly(writer, {"ok": False, "error": str(err)})
        except Exception:
            logger.exception("switch: closing %s after an internal error", session.peer)
            await _send_quietly(writer, {"ok": False, "error": "internal error"})
        finally:
            del self._connections[task]
            self.switch.connections -= 1
            self.switch.changed()
            writer.close()

    async def _dispatch(self, session: _Session, head: dict, reader, writer) -> None:
        name = head.get("op")
        handler = self._handlers.get(name) if isinstance(name, str) else None
        if handler is None:
            raise wire.ProtocolError(f"unknown op {_show(name)}; valid ops: {', '.join(self._handlers)}")
        if name != "reduce" and head.get("nbytes", 0):
            raise wire.ProtocolError(f"op {name} takes no payload")
        await handler(session, head, reader, writer)

    async def _hello(self, session: _Session, head: dict, reader, writer) -> None:
        if session.job is not None:
            raise wire.ProtocolError("hello sent twice")
        job = _job(head.get("job"))
        world = _int(head, "world", 1, MAX_WORLD)
        session.job, session.rank, session.world = job, _int(head, "rank", 0, world - 1), world
        await _send(writer, {"ok": True})

    async def _reduce(self, session: _Session, head: dict, reader, writer) -> None:
        if session.job is None:
            raise wire.ProtocolError("reduce before hello")
        if head.get("job") != session.job:
            raise wire.ProtocolError(f"reduce for job {_show(head.get('job'))} on job {session.job}'s connection")
        seq = _int(head, "seq", 0, MAX_SEQ)
        try:
            count = _payload_count(head)
        except wire.ProtocolError as err:
            self.switch.abort_key((session.job, seq), f"rank {session.rank}: {err}")
            raise
        op = self.switch.arrive(session.job, seq, session.rank, session.world, count)
        try:
            await self._receive(op, reader, 4 * count)
            self.switch.received(op, session.rank)
            await _verdict(op, reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.switch.abort(op, f"rank {session.rank} closed its connection")
            raise
        await _send(writer, *_reply(op))

    async def _receive(self, op: _Op, reader: asyncio.StreamReader, nbytes: int) -> None:
        for offset in range(0, nbytes, CHUNK):
            self.switch.add(op, offset, await reader.readexactly(min(CHUNK, nbytes - offset)))

    async def _log(self, session: _Session, head: dict, reader, writer) -> None:
        entries, after = self.switch.log_page(_int(head, "start", 0, MAX_SEQ) if "start" in head else 0, LOG_PAGE)
        await _send(writer, {"log": entries, "next": after})

    async def _stats(self, session: _Session, head: dict, reader, writer) -> None:
        await _send(writer, {"stats": self.switch.stats()})


async def _verdict(op: _Op, reader: asyncio.StreamReader) -> None:
    """Wait for the op's verdict; ConnectionError when the peer closes (or talks out of turn) first."""
    if op.verdict is not None:
        return
    decided = asyncio.ensure_future(op.decided.wait())
    closed = asyncio.ensure_future(reader.read(1))
    try:
        await asyncio.wait((decided, closed), return_when=asyncio.FIRST_COMPLETED)
    finally:
        decided.cancel()
        closed.cancel()
        await asyncio.wait((decided, closed))  # the reader is free again only once the read has ended
    if not closed.cancelled():
        closed.exception()  # retrieved: a reset is just a close here
    if op.verdict is None:
        raise ConnectionError("peer closed its connection while its op was aggregating")


def _reply(op: _Op) -> tuple[dict, memoryview | bytes]:
    if op.verdict == "done":
        return {"status": "done"}, memoryview(op.acc).cast("B")
    if op.verdict == "refused":
        return {"status": "refused", "holder": op.detail}, b""
    return {"status": "aborted", "reason": op.detail}, b""


async def _send(writer: asyncio.StreamWriter, head: dict, payload: memoryview | bytes = b"") -> None:
    """One message, its payload written a chunk at a time (bounded buffering per connection)."""
    view = memoryview(payload)
    writer.write(wire.encode(head, view)[0])
    for start in range(0, len(view), CHUNK):
        writer.write(view[start: start + CHUNK])
        await writer.drain()
    await writer.drain()


async def _send_quietly(writer: asyncio.StreamWriter, head: dict) -> None:
    try:
        await _send(writer, head)
    except (ConnectionError, wire.ProtocolError):
        pass


def _payload_count(head: dict) -> int:
    if head.get("dtype") != "float32":
        raise wire.ProtocolError(f"dtype {_show(head.get('dtype'))} is not float32")
    count = _int(head, "count", 0, wire.MAX_PAYLOAD // 4)
    if head.get("nbytes", 0) != 4 * count:
        raise wire.ProtocolError(f"payload of {head.get('nbytes', 0)} bytes for {count} float32")
    return count


def _int(head: dict, key: str, low: int, high: int) -> int:
    value = head.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise wire.ProtocolError(f"{key} {_show(value)} is not an integer in [{low}, {high}]")
    return value


def _job(value: object) -> str | int:
    if isinstance(value, str) and 0 < len(value) <= MAX_JOB_NAME:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise wire.ProtocolError(f"job {_show(value)} is neither an integer nor a name of 1 to {MAX_JOB_NAME} characters")


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# -- running it: a background thread (tests, one process), or a process of its own --------------------

class SwitchServer:
    """The aggregation service on a background thread of this process (its own asyncio loop)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, mode: str = "tdm", slots: int = 1,
                 link_gbps: float | None = None, op_timeout_s: float = 2.0):
        self.options = NetworkSwitchOptions(mode, slots, link_gbps, op_timeout_s)
        self.host = host
        self.port: int | None = None
        self._requested_port = port
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._service: _Service | None = None
        self._error: BaseException | None = None
        self._stats: dict = {}
        self._changed = threading.Condition()

    def start(self) -> int:
        """Listen and serve on a thread; returns the bound port."""
        if self._thread is not None:
            raise RuntimeError("the switch server was already started")
        ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(ready),), name="switch", daemon=True)
        self._thread.start()
        ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self.port

    def stop(self) -> None:
        """Close every connection and the listener; idempotent."""
        if self._thread is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:
            pass  # the loop is already closed
        self._thread.join()

    def log(self) -> list[dict]:
        """Finished operations: {"job", "seq", "start", "end" (time.time()), "verdict", "bytes", "ranks"}."""
        return self._on_loop(lambda: self._service.switch.log_page(0, LOG_LIMIT + 1)[0])

    def stats(self) -> dict:
        """The latest state: mode, slots, holders ({"job", "seq", "arrived", "summed"}), open ops, connections,
        and counts (done, refused, aborted, bytes reduced)."""
        with self._changed:
            return self._stats

    def wait_until(self, predicate: Callable[[dict], bool], timeout_s: float) -> dict:
        """Block until `predicate(stats)` holds (checked at every state change); TimeoutError otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self._stats), timeout_s):
                raise TimeoutError(f"the switch did not reach the state within {timeout_s} s: {self._stats}")
            return self._stats

    def __enter__(self) -> SwitchServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _main(self, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()

        def on_ready(port: int) -> None:
            self.port = port
            ready.set()

        try:
            self._service = _Service(self.options, self._publish)
            await self._service.run(self.host, self._requested_port, self._stop, on_ready)
        except BaseException as err:
            if ready.is_set():
                logger.exception("switch: the server thread failed")
            self._error = err
            ready.set()

    def _publish(self, stats: dict) -> None:
        with self._changed:
            self._stats = stats
            self._changed.notify_all()

    def _on_loop(self, fn: Callable):
        if self._thread is not None and self._thread.is_alive():
            async def call():
                return fn()

            try:
                return asyncio.run_coroutine_threadsafe(call(), self._loop).result()
            except RuntimeError:
                pass  # the loop closed meanwhile: read it from here
        return fn()


def serve(host: str = "127.0.0.1", port: int = 0, mode: str = "tdm", link_gbps: float | None = None,
          op_timeout_s: float = 2.0, *, slots: int = 1, on_ready: Callable[[int], None] | None = None) -> None:
    """Serve in this thread until SIGTERM or SIGINT; `on_ready(port)` once listening."""
    options = NetworkSwitchOptions(mode, slots, link_gbps, op_timeout_s)

    async def run() -> None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, stop.set)
        await _Service(options).run(host, port, stop, on_ready or (lambda _port: None))

    asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvmsched.runtime.collectives.switch",
                                     description="An aggregation service that plays an in-network-aggregation switch.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--mode", choices=MODES, default="tdm")
    parser.add_argument("--slots", type=int, default=1, help="ops aggregated at once (spatial mode)")
    parser.add_argument("--link-gbps", type=float, default=None, help="emulated link rate (default: unpaced)")
    parser.add_argument("--op-timeout", type=float, default=2.0, help="seconds before an incomplete op aborts")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    try:
        serve(args.host, args.port, args.mode, args.link_gbps, args.op_timeout, slots=args.slots,
              on_ready=lambda port: print(f"switch listening on {args.host}:{port}", flush=True))
    except TvmschedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


# -- the blocking client (an agent's I/O thread) ------------------------------------------------------

class SwitchClient:
    """One rank's connection to the switch. Every connection or protocol failure raises ConnectionError
    (the agent then falls back to a ring AllReduce) and leaves the client closed."""

    def __init__(self, host: str, port: int, job: str | int, rank: int, world: int, *, timeout_s: float = 30.0):
        self.job, self.rank, self.world = job, rank, world
        self._buffer = np.empty(0, np.float32)
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as err:
            raise ConnectionError(f"cannot reach the switch at {host}:{port}: {err}") from err
        head, _ = self._exchange({"op": "hello", "job": job, "rank": rank, "world": world})
        if head.get("ok") is not True:
            self._fail(f"the switch refused hello: {head.get('error', head)}")

    def reduce(self, seq: int, array: np.ndarray, *, out: np.ndarray | None = None) -> tuple[str, object]:
        """AllReduce (sum) `array` as op `seq`: ("done", sum) | ("refused", holder) | ("aborted", reason).

        The sum lands in `out` when given (it may be `array` itself), else in a buffer of this client that
        the next call overwrites: copy it to keep it.
        """
        for name, given in (("array", array), ("out", out)):
            if given is not None and (given.dtype != np.float32 or given.ndim != 1 or not given.flags.c_contiguous):
                raise ValueError(f"{name} must be a 1-D contiguous float32 array")
        if out is not None and out.shape != array.shape:
            raise ValueError(f"out has shape {out.shape}, array {array.shape}")
        if out is None:
            if len(self._buffer) < len(array):
                self._buffer = np.empty(len(array), np.float32)
            out = self._buffer[: len(array)]
        head = {"op": "reduce", "job": self.job, "seq": seq, "dtype": "float32", "count": len(array)}
        reply, payload = self._exchange(head, memoryview(array).cast("B"), memoryview(out).cast("B"))
        return self._result(reply, payload, out)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self) -> SwitchClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _exchange(self, head: dict, payload: memoryview | bytes = b"", into: memoryview | None = None):
        if self._sock is None:
            raise ConnectionError("the switch client is closed")
        try:
            wire.send(self._sock, head, payload)
            return wire.recv(self._sock, into)
        except (OSError, wire.ProtocolError) as err:
            self._fail(f"switch connection failed: {err or type(err).__name__}", err)

    def _result(self, reply: dict, payload: memoryview | bytes, out: np.ndarray) -> tuple[str, object]:
        status = reply.get("status")
        if status == "done" and len(payload) == out.nbytes:
            if len(payload) and not np.shares_memory(np.frombuffer(payload, np.uint8), out):
                out[:] = np.frombuffer(payload, np.float32)
            return "done", out
        if status == "refused":
            return "refused", reply.get("holder")
        if status == "aborted":
            return "aborted", reply.get("reason", "")
        self._fail(f"unexpected switch reply {_show(reply)} with {len(payload)} payload bytes")

    def _fail(self, message: str, cause: BaseException | None = None):
        self.close()
        raise ConnectionError(message) from cause


def query(host: str, port: int, request: dict, *, timeout_s: float = 10.0) -> dict:
    """One monitoring request (`{"op": "log"}`, `{"op": "stats"}`) on a connection of its own."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        wire.send(sock, request)
        return wire.recv(sock)[0]


def fetch_log(host: str, port: int, *, timeout_s: float = 10.0) -> list[dict]:
    """Every finished operation a switch process still keeps."""
    entries: list[dict] = []
    after = 0
    while True:
        reply = query(host, port, {"op": "log", "start": after}, timeout_s=timeout_s)
        if not reply["log"]:
            return entries
        entries += reply["log"]
        after = reply["next"]


if __name__ == "__main__":
    sys.exit(main())
