"""The inference service behind both protocols: models, their tensors, admission, counters.

HTTP (serve/http.py) and gRPC (serve/grpc_server.py) read their infer messages with each model's `Codec` (the
engine's, tvmsched/kserve.h) and turn them into calls of `InferenceService`; errors are `ServeError`s carrying the
HTTP status (the gRPC code follows from it: errors.GRPC_CODES).

Per-request scheduling (`parameters` of a v2 request):
- priority: 1 or "realtime" runs the request as real-time (it preempts the busy best-effort models' streams
  while it runs, Runtime.submit(priority=)); 0 or absent: the model's own priority; 2 and above or
  "best_effort": best-effort. Anything else: 400.
- timeout (µs, as Triton's): a deadline for the request to start. A request whose model already has more work
  ahead of it than it can wait (requests of that model queued or running × their recent compute time) is refused
  at once with 504 (gRPC DEADLINE_EXCEEDED), never queued; one admitted but still queued in the engine when its
  deadline passes fails there with the same status instead of starting late (Runtime.submit(start_within_us=));
  0 or absent: no deadline.
- A model with `max_queue` requests queued or running answers more with 503 (gRPC UNAVAILABLE) at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm_ffi

from tvmsched.errors import TvmschedError
from tvmsched.runtime import native
from tvmsched.serve.errors import ServeError
from tvmsched.serve.repository import ModelSpec, Repository, check_artifact

log = logging.getLogger(__name__)

VERSION = "1"  # a model's version unless its Triton-layout folder says otherwise (ModelSpec.version)
SERVER_VERSION = "0.1.0"
EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics", "model_configuration", "schedule_policy")
LATE_START = "did not start within its deadline"  # the engine's refusal of a request queued past its deadline
INLINE_WAIT_S = 0.002  # an idle server waits on its own thread for a request expected to take at most this long


class Codec(NamedTuple):
    """The engine's reader and writer of a model's inference messages (tvmsched/kserve.h, engine kserve_codec), each
    answering [status, one line] for a bad request: a REST body (serve/http.py), a gRPC ModelInfer call's bytes
    (serve/grpc_server.py) and a /v1 body (examples/server.py's contract, as the C++ server reads it)."""

    parse: object  # (body, Inference-Header-Content-Length or None) -> [0, inputs, parameters, pending]
    encode: object  # (pending, outputs) -> [0, body, header length or -1]
    parse_message: object  # (ModelInferRequest bytes) -> [0, inputs, parameters, pending]
    encode_message: object  # (pending, outputs) -> [0, ModelInferResponse bytes]
    parse_v1: object  # (/v1 body) -> [0, inputs]
    encode_v1: object  # (outputs) -> [0, /v1 answer]


@dataclass
class Served:
    """A loaded model as the server sees it."""

    spec: ModelSpec
    model: object  # runtime.Model
    max_queue: int
    codec: Codec | None = None  # the engine's parsers and encoders of its requests (REST and gRPC)
    batch: int = 0  # the batch size it was compiled for: requests bring 1 to `batch` rows (0: not batched)
    # the engine's record of it as served (tvmsched/serving.h, the C++ server's too): admission by max_queue, Triton's
    # counters, its metadata, model configuration and statistics
    book: object = None

    @property
    def compute_s(self) -> float:
        """Its recent compute time per request (an average of the latest; 0 until one ran)."""
        return self.book.recent_ns() / 1e9

    @property
    def name(self) -> str:
        return self.spec.name


class InferenceService:
    """Models served from one Runtime; thread-safe (HTTP handlers and gRPC calls share it)."""

    def __init__(self, runtime, *, max_queue: int = 64, repository: Repository | None = None):
        self.runtime, self.max_queue, self.repository = runtime, max_queue, repository
        self.models: dict[str, Served] = {}
        self.failed: dict[str, str] = {}  # repository models whose last load failed: the reason
        self._load_lock = threading.Lock()  # one load or unload at a time
        # every served model and its book, in one tuple replaced whole on a load or unload: for engine calls over
        # all books (pending requests summed; a gRPC message's model found and parsed)
        self._roster: tuple[tuple[Served, ...], tvm_ffi.Array] = ((), tvm_ffi.Array([]))
        self._pending_of = native.func("served_pending")
        self._find, self._parse_message = native.func("served_find"), native.func("served_parse_message")

    # -- model control
    def add(self, spec: ModelSpec) -> Served:
        """Load a model (warmed up unless spec.warmup is False); a TvmschedError names what is wrong."""
        check_artifact(spec.path)
        with self._load_lock:
            if spec.name in self.models:
                raise ServeError(f"model {spec.name!r} is already loaded", 409)
            model = self.runtime.load(spec.path, qos_ms=spec.qos_ms, priority=spec.priority, name=spec.name,
                                      warmup=spec.warmup, streams=spec.streams,
                                      max_queue_delay_us=spec.max_queue_delay_us,
                                      preferred_batch_sizes=spec.preferred_batch_sizes, queue_policy=spec.queue_policy,
                                      devices=spec.devices, refresh_sizes=spec.refresh_sizes)
            manifest = model.task.executor.manifest
            batch = manifest.batch_size or 0  # a Triton config's max_batch_size may lower it
            served = Served(spec, model, spec.max_queue or self.max_queue, batch=spec.max_batch_size or batch)
            served.book = self.runtime.served(model, version=spec.version, max_batch_size=served.batch,
                                              max_queue=served.max_queue, streams=spec.streams,
                                              max_queue_delay_us=spec.max_queue_delay_us,
                                              preferred_batch_sizes=spec.preferred_batch_sizes or ())
            served.codec = Codec(*served.book.codec())  # over its tensors as its metadata shows them
            self.models[spec.name] = served
            self._set_roster()
            self.failed.pop(spec.name, None)
        log.info("serving model %s from %s", spec.name, spec.path)
        return served

    def load(self, name: str, parameters=()) -> None:
        """Load (or reload) a model of the repository. `parameters`: the names of the load request's parameters
        (Triton's `config` and `file:PATH` override the model's folder for this load; tvmsched reads the folder only,
        so either is refused rather than ignored)."""
        if self.repository is None:
            raise ServeError("this server has no model repository (--model-repository)", 400)
        overrides = sorted(p for p in parameters if p == "config" or p.startswith("file:"))
        if overrides:
            raise ServeError(f"load parameter {overrides[0]!r} is not supported: tvmsched loads model {name!r} from "
                             f"its folder in the repository (edit its config there, then load it)", 400)
        try:
            spec = self.repository.spec(name)
        except LookupError as err:
            raise ServeError(str(err), 404) from None
        if name in self.models:
            self.unload(name)
        try:
            self.add(spec)
        except TvmschedError as err:
            self.failed[name] = str(err)
            raise ServeError(f"failed to load model {name!r}: {err}", getattr(err, "status", 400)) from None

    def unload(self, name: str) -> None:
        """Stop serving a model: its queued and running requests finish first (Runtime.unload)."""
        with self._load_lock:
            served = self.models.pop(name, None)
            if served is None:
                raise ServeError(f"no model named {name!r} is loaded", 404)
            self._set_roster()
            self.runtime.unload(served.model)
        log.info("unloaded model %s", name)

    def index(self) -> list[dict]:
        names = set(self.models) | set(self.repository.names() if self.repository else ())
        rows = []
        for name in sorted(names):
            row = {"name": name}
            if name in self.models:
                row.update(version=self.models[name].spec.version, state="READY")
            else:
                row.update(state="UNAVAILABLE", reason=self.failed.get(name, "unloaded"))
            rows.append(row)
        return rows

    # -- lookups and descriptions
    def _set_roster(self) -> None:
        served = tuple(self.models.values())
        self._roster = (served, tvm_ffi.Array([s.book for s in served]))

    def get(self, name: str, version: str = "") -> Served:
        served = self.models.get(name)
        if served is None or version not in ("", served.spec.version):  # the engine's line (the C++ server's too)
            roster, books = self._roster
            found = self._find(books, name, version)
            if found[0]:
                raise ServeError(str(found[1]), int(found[0]))
            served = roster[int(found[1])]  # (loaded since)
        return served

    def parse_message(self, message: bytes) -> tuple[Served | None, list]:
        """A gRPC ModelInferRequest's model and the request parsed by its codec, in one engine call
        (tvmsched.engine.served_parse_message): (served, [0, inputs, parameters, pending]); refused, (served, [status,
        line]) for a bad request to a served model, (None, [status, line]) for a message that is not one or names no
        served model."""
        roster, books = self._roster
        parsed = self._parse_message(books, message)
        if parsed[0]:
            return (roster[int(parsed[2])] if int(parsed[2]) >= 0 else None), [int(parsed[0]), str(parsed[1])]
        return roster[int(parsed[1])], [0, parsed[2], parsed[3], parsed[4]]

    def server_metadata(self) -> dict:
        return {"name": "tvmsched", "version": SERVER_VERSION, "extensions": list(EXTENSIONS)}

    def model_metadata(self, served: Served) -> dict:
        return json.loads(served.book.metadata())

    def model_config(self, served: Served) -> dict:
        """Triton's model configuration, as far as it applies (the engine's, as the C++ server's): max_batch_size, the
        batch size a model was compiled for (0: not batched), dims without the batch dimension when there is one, its
        streams as the instance count, and the parameters it is served with."""
        return json.loads(served.book.config())

    def statistics(self, name: str = "", version: str = "") -> dict:
        """Triton's statistics JSON: {"model_stats": [...]} for one model or all (the engine's, as the C++ server's)."""
        models = [self.get(name, version)] if name else list(self.models.values())
        return json.loads(native.func("served_statistics")([served.book for served in models]))

    # -- inference
    def submit(self, served: Served, inputs: dict[str, np.ndarray], parameters: dict | None = None,
               engine_tensors: bool = False):
        """Admit and queue one request; returns the engine's future (answer it with `finish`, run or failed).
        `engine_tensors`: inputs and outputs are the engine's maps of tensors (Runtime.submit)."""
        priority, timeout_us = _scheduling(parameters or {})
        rows = int(next(iter(inputs.values())).shape[0]) if served.batch and inputs else 1
        if rows > served.batch > 0:  # (a Triton config's max_batch_size may be below the compiled size)
            name = next(iter(inputs))
            raise ServeError(f"input '{name}' has {rows} rows: the model takes 1 to {served.batch} rows per request "
                             "(max_batch_size)")
        book = served.book
        if timeout_us:
            ahead, each_us = book.pending(), book.recent_ns() / 1e3
            if ahead and ahead * each_us > timeout_us:
                raise ServeError(f"model {served.name!r} cannot start this request within its timeout of {timeout_us} "
                                 f"µs: {ahead} requests are ahead of it, ~{each_us:.0f} µs each", 504)
        if book.admit() < 0:
            raise ServeError(f"model {served.name!r} has {served.max_queue} requests queued or running, its limit "
                             f"(max_queue {served.max_queue}): try again later", 503)
        try:
            future = self.runtime.submit(served.model, inputs, priority=priority, start_within_us=timeout_us or None,
                                         engine_tensors=engine_tensors)
            future.rows = rows
            return future
        except BaseException:
            book.release()  # (the caller counts it as refused)
            raise

    async def outputs(self, served: Served, future) -> dict[str, np.ndarray]:
        """The outputs of a submitted request, awaited (`inline_outputs` first, else on the event loop)."""
        try:
            outputs = self.inline_outputs(served, future)
            return outputs if outputs is not None else await asyncio.wrap_future(future)
        except TvmschedError as err:
            if LATE_START in str(err):  # admitted, but the engine found it still queued at its deadline
                raise ServeError(str(err), 504) from None
            raise

    def inline_outputs(self, served: Served, future) -> dict[str, np.ndarray] | None:
        """When it is the only request the server holds and its model's requests take at most INLINE_WAIT_S, the
        calling thread (the event loop's) waits for it itself (in C++, GIL released): nobody else is waiting on the
        loop, and the hand-off from the engine's thread to the loop (~100-200 µs on a loaded 2-core machine,
        bench/results/serving.md) is saved. The wait polls (yielding its core) for about the model's recent time, so
        the request is seen done at once, not after a sleeping thread's wake-up. None: not this case, or it ran past
        twice its model's recent time (then awaited as usual)."""
        compute_s = served.compute_s
        if not (0 < compute_s <= INLINE_WAIT_S and self._pending_of(self._roster[1]) == 1):
            return None
        spin = {"spin_us": 1.5e6 * compute_s} if hasattr(future, "request") else {}  # (refused: a plain Future)
        try:
            return future.result(timeout=2 * compute_s, **spin)
        except FutureTimeout:
            return None

    async def answer(self, served: Served, future, received_ns: int) -> dict[str, np.ndarray]:
        """The outputs of an admitted request, awaited and counted (`finish`) whether it succeeds or fails."""
        error = None
        try:
            return await self.outputs(served, future)
        except TvmschedError as err:
            error = err
            raise
        finally:
            self.finish(served, future, received_ns, error)

    def finish(self, served: Served, future, received_ns: int, error: BaseException | None) -> None:
        """Count one answered request (admitted by `submit`; `received_ns`: its arrival, time.monotonic_ns())."""
        served.book.answered(getattr(future, "request", None), getattr(future, "rows", 1), error is not None,
                             received_ns)

    def count_failure(self, served: Served, received_ns: int) -> None:
        """A request refused before it was admitted (bad input, queue full, deadline)."""
        served.book.refused(received_ns)


def _scheduling(parameters: dict) -> tuple[str | None, int]:
    """(priority for Runtime.submit or None: the model's; timeout µs, 0: none) from a request's parameters, read by the
    engine (kserve::ReadScheduling, as the C++ server reads them)."""
    if not parameters:
        return None, 0
    status, *rest = native.func("kserve_scheduling")(parameters)
    if status:
        raise ServeError(str(rest[0]), int(status))
    priority, timeout = int(rest[0]), int(rest[1])
    return {1: "realtime", 0: "best_effort"}.get(priority), timeout
