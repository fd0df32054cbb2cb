"""Session fixtures every test folder shares: compiled artifacts and onnxruntime references made once per run
(tests/artifact_cache.py), and the command line called in process (`cli`), checked for what it leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.artifact_cache import Cache, Compiled, References

# MetaSchedule times each tuning candidate for at least 100 ms; the tests' tuning checks the plumbing (records, rounds,
# candidates, fallbacks), not the kernels' speed, so 10 ms each (test_tuned_compile.py alone: 48 s at 100 ms, 31 s at
# 10; the ten tuning test files on 2 workers: 146 s, 130 s). Set before any test runs, so the CLI's subprocesses and
# MetaSchedule's runner workers inherit it.
os.environ.setdefault("TVMSCHED_TUNE_MEASURE_MS", "10")
# TVM's own thread pool (MetaSchedule's runner, the compile's side-by-side timings; the engine has its own pool) spins
# 300000 rounds before it sleeps: beside the other pytest-xdist worker that spin is CPU taken from it. Without it the
# ten tuning test files took 126 s and 231 s of CPU instead of 150 s and 279 s (one run each, 2 workers).
os.environ.setdefault("TVM_THREAD_POOL_SPIN_COUNT", "0")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Every pytest worker collects every test module; those that define TVMScript functions at import (@T.prim_func)
    load 5-10x faster with inspect's module lookup memoized, as tvmsched loads TVM's tensor intrinsics."""
    from tvmsched.lower.intrinsics import inspect_getmodule_memoized

    with inspect_getmodule_memoized():
        return (yield)


@pytest.fixture(scope="session")
def _cache(tmp_path_factory: pytest.TempPathFactory):
    """The run's cache folder: under the basetemp that every pytest-xdist worker of the run shares, or the one
    $TVMSCHED_TEST_CACHE names (`make test`'s second pass, the asynchronous one, takes the first pass's)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's basetemp is <run's basetemp>/popen-gwN
    cache = Cache(Path(os.environ.get("TVMSCHED_TEST_CACHE") or base / "shared-cache").resolve())  # (tests link to it)
    yield cache
    changed = cache.changed()
    assert not changed, f"tests wrote into shared cached files (take a copy: compiled.copy): {changed}"


@pytest.fixture(scope="session")
def compiled(_cache: Cache) -> Compiled:
    """`compiled(model, **compile_options) -> Path`: a shared, read-only artifact, compiled once per run.

    `model` is a zoo name or an ONNX ModelProto; `compiled.artifact(...)` loads it as an Artifact and
    `compiled.copy(model, dest, ...)` gives a writable copy (for tests that sign, tamper with or rewrite one).
    Tests whose subject is compiling call the compiler themselves."""
    return Compiled(_cache)


@pytest.fixture(scope="session")
def reference(_cache: Cache) -> References:
    """`reference(model, inputs) -> {output name: array}`: onnxruntime's outputs, computed once per run."""
    return References(_cache)


@pytest.fixture
def cli():
    """`cli(*args) -> CompletedProcess`: `tvmsched ARGS...` run in this process (tvmsched.cli.main.main, its
    one-line errors and exit codes included), stdout and stderr captured as a subprocess's would be.

    For what only a process shows (signals, a server's start and stop, engine environment variables), use
    tests.helpers.run_cli. Each call checks: no gc.freeze() left, and the signal handlers, logging handlers and
    levels and os.environ as before. (Module-scoped fixtures call tests.helpers.cli_in_process, the same.)"""
    from tests.helpers import cli_in_process

    return cli_in_process
