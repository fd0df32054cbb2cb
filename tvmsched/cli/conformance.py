"""ONNX backend node-test conformance: compile and run the cases shipped in `onnx`, compare outputs.

Each case runs in a reusable worker process, so a crash (segfault) or a hang in the compiler costs
only that case: the worker is replaced and the sweep goes on.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from multiprocessing.connection import Connection, wait

import numpy as np

from tvmsched.errors import one_line

log = logging.getLogger(__name__)

SUPPORTED_OPS: frozenset[str] = frozenset(
    {
        "Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "Sigmoid", "Tanh", "Softmax", "MaxPool",
        "AveragePool", "GlobalAveragePool", "BatchNormalization", "Concat", "Reshape", "Transpose",
        "Flatten", "LayerNormalization", "Gelu", "Erf",
    }
)  # fmt: skip

DEFAULT_TIMEOUT_S = 120.0
# A case's clock starts when its worker is ready (spawned and imported): starting one on a loaded machine can take
# long, and would otherwise eat into the first case's time. A worker that never gets ready is given up after this.
STARTUP_TIMEOUT_S = 300.0
_MAX_MESSAGE = 300


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one test case: status is "pass", "fail" (wrong output) or "error" (raised, crashed, hung)."""

    name: str
    status: str
    message: str
    seconds: float


class _Mismatch(AssertionError):
    """An output differs from the expected one (message already one line)."""


def case_ops(case) -> tuple[str, ...]:
    """The sorted op types of a case's graph nodes."""
    return tuple(sorted({node.op_type for node in case.model.graph.node}))


@cache
def _all_cases() -> tuple:
    from onnx.backend.test.case.node import collect_testcases

    # collect_testcases(op_type) filters a process-wide list on its first call only: always ask for all.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(collect_testcases(None))


def collect_cases(ops: Iterable[str] = SUPPORTED_OPS) -> list:
    """The onnx node test cases whose graph nodes all have an op type in `ops`."""
    ops = frozenset(ops)
    cases = [case for case in _all_cases() if case.model is not None and case.model.graph.node]
    return [case for case in cases if set(case_ops(case)) <= ops]


def run_case(case) -> CaseResult:
    """Compile `case.model` on CPU, run every data set and compare every output; never raises."""
    start = time.perf_counter()
    try:
        _check_case(case)
    except _Mismatch as err:
        return CaseResult(case.name, "fail", str(err), time.perf_counter() - start)
    except Exception as err:
        message = f"{type(err).__name__}: {one_line(err)}"[:_MAX_MESSAGE]
        return CaseResult(case.name, "error", message, time.perf_counter() - start)
    return CaseResult(case.name, "pass", "", time.perf_counter() - start)


def _check_case(case) -> None:
    from tvmsched.frontend import loader as frontend
    from tvmsched.pipeline import compile_model
    from tvmsched.runtime import Executor

    executor = Executor(compile_model(case.model, name=case.name))
    real_inputs = {value.name for value in frontend.graph_inputs(case.model)}
    output_names = [value.name for value in case.model.graph.output]
    for index, (inputs, expected) in enumerate(case.data_sets):
        # the data set's inputs follow the order of graph.input
        feeds = {v.name: np.asarray(a) for v, a in zip(case.model.graph.input, inputs) if v.name in real_inputs}
        actual = executor.run(feeds)
        for name, want in zip(output_names, expected, strict=True):
            _compare(f"data set {index}, output {name!r}", actual[name], np.asarray(want), case.rtol, case.atol)


def _compare(what: str, actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float) -> None:
    if actual.shape != expected.shape:
        raise _Mismatch(f"{what}: shape {actual.shape}, expected {expected.shape}")
    if actual.dtype != expected.dtype:
        raise _Mismatch(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    try:
        np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as err:
        details = [line.strip() for line in str(err).splitlines() if line.strip().startswith(("Mismatched", "Max"))]
        raise _Mismatch(f"{what}: " + "; ".join(details or [one_line(err)])) from None


def run_sweep(
    cases: list, workers: int = 2, progress: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[CaseResult]:
    """Run `cases` in `workers` reusable worker processes; results come back in the order of `cases`.

    A worker that dies or runs past `timeout_s` on a case (counted from when the worker was ready to run
    it, so a slow start of the worker is not counted) makes that case an "error" and is replaced.
    """
    from tqdm import tqdm

    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    threads = 1 if workers > 1 else (os.cpu_count() or 1)
    results: dict[int, CaseResult] = {}
    pending = list(enumerate(cases))[::-1]
    pool: list[_Worker] = []
    with tqdm(total=len(cases), desc="conformance", unit="case", disable=not progress) as bar:
        try:
            while pending or any(w.job for w in pool):
                pool = [w for w in pool if w.alive]
                pool += [_Worker(threads) for _ in range(min(workers - len(pool), len(pending)))]
                for worker in pool:
                    if worker.job is None and pending:
                        worker.submit(*pending.pop())
                for index, result in _collect(pool, timeout_s):
                    results[index] = result
                    bar.update()
                    bar.set_postfix(bad=sum(r.status != "pass" for r in results.values()))
        finally:
            for worker in pool:
                worker.close()
    return [results[index] for index in range(len(cases))]


def _collect(pool: list[_Worker], timeout_s: float) -> list[tuple[int, CaseResult]]:
    """Wait for the busy workers; return the finished jobs (a crashed or hung worker is killed)."""
    busy = [w for w in pool if w.job is not None]
    first_deadline = min(w.deadline(timeout_s) for w in busy)
    handles = [w.conn for w in busy] + [w.process.sentinel for w in busy]
    ready = wait(handles, max(0.0, first_deadline - time.monotonic()))
    done = []
    for worker in busy:
        if worker.conn in ready or worker.process.sentinel in ready:
            finished = worker.receive()  # None: the worker just got ready, its case's clock starts now
            if finished is not None:
                done.append(finished)
        elif time.monotonic() > worker.deadline(timeout_s):
            why = f"timed out after {timeout_s:.0f} s" if worker.ready else f"worker did not start in {STARTUP_TIMEOUT_S:.0f} s"
            done.append(worker.fail(why))
    return done


class _Worker:
    """One spawned process that runs cases sent through a pipe, one at a time."""

    def __init__(self, threads: int):
        context = multiprocessing.get_context("spawn")  # never fork a parent that may hold TVM threads
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, threads), daemon=True)
        self.process.start()
        child.close()
        self.job: tuple[int, str] | None = None
        self.spawned = self.started = time.monotonic()
        self.ready = False  # the worker has said it is ready (spawned, imports done)
        self.alive = True

    def deadline(self, timeout_s: float) -> float:
        """When the current case counts as hung: `timeout_s` after the later of its submission and the worker
        getting ready; while the worker starts, STARTUP_TIMEOUT_S after it was spawned."""
        return self.started + timeout_s if self.ready else self.spawned + max(timeout_s, STARTUP_TIMEOUT_S)

    def submit(self, index: int, case) -> None:
        self.job, self.started = (index, case.name), time.monotonic()
        try:
            self.conn.send(case)
        except OSError:  # the worker died; `receive` reports it as a crash
            pass

    def receive(self) -> tuple[int, CaseResult] | None:
        try:
            result = self.conn.recv()
        except (EOFError, OSError):
            self.process.join(60)  # it is exiting: returns as soon as it has, however loaded the machine
            return self.fail(f"worker crashed (exit code {self.process.exitcode})")
        if result == _READY:
            self.ready, self.started = True, time.monotonic()
            return None
        index, self.job = self.job[0], None
        return index, result

    def fail(self, message: str) -> tuple[int, CaseResult]:
        index, name = self.job
        log.warning("%s: %s", name, message)
        self.close()
        return index, CaseResult(name, "error", message, time.monotonic() - self.started)

    def close(self) -> None:
        self.alive, self.job = False, None
        if self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


_READY = "ready"


def _worker_main(conn: Connection, threads: int) -> None:
    """Worker loop: receive a case, send back its result; None stops it. Compiler chatter goes to /dev/null."""
    os.environ["TVM_NUM_THREADS"] = str(threads)  # before TVM is imported in this process
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    conn.send(_READY)
    while (case := conn.recv()) is not None:
        conn.send(run_case(case))
