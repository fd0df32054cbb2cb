"""Session fixtures every test folder shares: compiled artifacts and onnxruntime references made once per run
(tests/artifact_cache.py), and the command line called in process (`cli`), checked for what it leaves behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.artifact_cache import Cache, Compiled, References


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Every pytest worker collects every test module; those that define TVMScript functions at import (@T.prim_func)
    load 5-10x faster with inspect's module lookup memoized, as tvmsched loads TVM's tensor intrinsics."""
    from tvmsched.lower.intrinsics import inspect_getmodule_memoized

    with inspect_getmodule_memoized():
        return (yield)


# the modules that take longest (setup and tests, seconds on 2 cores under `make test`'s two workers), longest first:
# pytest-xdist's --dist loadscope hands a worker the next module in collection order each time it is free, so these go
# first and the run does not end with one worker still on a minute-long module while the other idles
LONGEST_FIRST = (
    "tests/runtime/test_collectives.py",  # 75-100 s: torch ranks, lost messages, killed ranks
    "tests/test_tuned_compile.py",  # 50-110 s: tuning
    "tests/test_candidates.py",  # 37-60 s
    "tests/test_fuzz.py",  # 36-40 s
    "tests/test_soak.py",  # 40-50 s
    "tests/serve/test_ray_serve.py",  # 40-45 s
    "tests/test_gpu_schedule.py",  # 40-50 s
    "tests/test_gpu_suite.py",  # 45-60 s
    "tests/tuning_db/test_service_fuzz.py",  # 20-30 s
    "tests/test_conformance.py",  # 25-30 s
)


def pytest_collection_modifyitems(items: list) -> None:
    """LONGEST_FIRST's modules first, in its order; every other test keeps its place (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def module(item) -> str:
        return Path(str(item.fspath)).relative_to(Path(__file__).resolve().parent.parent).as_posix()

    items.sort(key=lambda item: rank.get(module(item), len(rank)))


@pytest.fixture(scope="session")
def _cache(tmp_path_factory: pytest.TempPathFactory):
    """The run's cache folder: under the basetemp that every pytest-xdist worker of the run shares, or the one
    $TVMSCHED_TEST_CACHE names (`make test`'s second pass, the asynchronous one, takes the first pass's)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # each worker's basetemp is <run's basetemp>/popen-gwN
    cache = Cache(Path(os.environ.get("TVMSCHED_TEST_CACHE") or base / "shared-cache"))
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
