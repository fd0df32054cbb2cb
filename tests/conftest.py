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
    from tvmsched.tune.search import inspect_getmodule_memoized

    with inspect_getmodule_memoized():
        return (yield)


# The modules that keep one pytest-xdist worker busy longest (about 40 s to 3 min each on 2 cores: compiles and tunes
# that are their subject, torch jobs, servers under load), slowest first. `make test` hands whole modules to its two
# workers (--dist loadscope) in collection order (--no-loadscope-reorder): these go first, so that the run ends on
# short modules instead of one worker finishing a long one alone (xdist's own order, most tests first, put the long
# modules of few tests last). The others follow, most tests first. A stale entry costs balance, never a test.
SLOW_MODULES = (
    "tests/runtime/test_collectives.py",
    "tests/runtime/test_runtime.py",
    "tests/test_real_models.py",
    "tests/test_tuned_compile.py",
    "tests/test_gpu_suite.py",
    "tests/test_conformance.py",
    "tests/test_candidates.py",
    "tests/test_tuning_rounds.py",
    "tests/test_import_fixes.py",
    "tests/runtime/test_stress.py",
    "tests/test_fuzz.py",
    "tests/test_soak.py",
    "tests/tuning_db/test_cli_db.py",
    "tests/test_cli.py",
    "tests/test_rpc_tuning.py",
    "tests/passes/test_grid_limit.py",
    "tests/test_gpu_schedule.py",
    "tests/test_tune_budget.py",
    "tests/test_wheel.py",
    "tests/test_invalid_onnx.py",
    "tests/test_index_checks.py",
    "tests/test_cpu_schedule.py",
    "tests/tuning_db/test_service_fuzz.py",
    "tests/test_signing.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Whole modules in the order above (a stable sort: each module's tests keep theirs)."""
    module = lambda item: item.nodeid.split("::", 1)[0]
    rank = {name: index for index, name in enumerate(SLOW_MODULES)}
    counts: dict[str, int] = {}
    for item in items:
        counts[module(item)] = counts.get(module(item), 0) + 1
    items.sort(key=lambda item: (rank.get(module(item), len(rank)), -counts[module(item)]))


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
