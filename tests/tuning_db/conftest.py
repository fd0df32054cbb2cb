"""Fixtures for the tuning-database tests: SQLite files, a real PostgreSQL server, tiny tunes."""

from __future__ import annotations

import shutil
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import add_relu_mod, matmul_mod, tiny_tune


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """SQLAlchemy URL of a PostgreSQL server started with pgserver for this session.

    A server that cannot start fails the tests that need it: PostgreSQL coverage is never
    skipped silently.
    """
    pgdata = tempfile.mkdtemp(prefix="tvms-pg-")  # short path: the unix socket lives there
    try:
        from sqlalchemy.engine import make_url

        with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set"
            warnings.simplefilter("ignore")
            import pgserver

            server = pgserver.get_server(pgdata, cleanup_mode="stop")
        url = make_url(server.get_uri()).set(drivername="postgresql+psycopg")
    except Exception as err:  # noqa: BLE001
        shutil.rmtree(pgdata, ignore_errors=True)
        pytest.fail(f"could not start PostgreSQL with pgserver: {err!r}", pytrace=False)
    assert url.query.get("host"), f"expected a unix-socket host= parameter in {url}"
    yield url.render_as_string(hide_password=False)
    server.cleanup()
    shutil.rmtree(pgdata, ignore_errors=True)


@pytest.fixture
def pg_url(pg_admin_url: str) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database (dropped afterwards)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(pg_admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(pg_admin_url).set(database=name).render_as_string(hide_password=False)
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tuning.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url: str):
    """An empty SQLStore on each backend."""
    from tvmsched.tuning_db import SQLStore

    s = SQLStore(db_url)
    yield s
    s.close()


@pytest.fixture(scope="session")
def tuned_sqlite(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, object]:
    """(URL, module): a 64x64 matmul tuned (8 trials, llvm 2 cores) into a SQLite TuningDatabase."""
    from tvmsched.tuning_db import SQLStore, TuningDatabase

    root = tmp_path_factory.mktemp("tuned")
    url = f"sqlite:///{root / 'tuning.db'}"
    mod = matmul_mod()
    store = SQLStore(url)
    tiny_tune(mod, TuningDatabase(store), root / "work")
    store.close()
    return url, mod


@pytest.fixture(scope="session")
def tuned_ms_json(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """(work_dir, module): relu(x + y) tuned (4 trials) into MetaSchedule's own JSONDatabase."""
    import tvm.s_tir.meta_schedule as ms

    work_dir = tmp_path_factory.mktemp("msjson")
    mod = add_relu_mod()
    tiny_tune(mod, ms.database.JSONDatabase(work_dir=str(work_dir)), work_dir, trials=4)
    return work_dir, mod
