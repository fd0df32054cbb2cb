"""A real tuning-database service for tests: uvicorn serving ``create_app`` on 127.0.0.1 in a thread."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import uvicorn

from tests.helpers import free_port
from tvmsched.tuning_db.service import create_app
from tvmsched.tuning_db.store import SQLStore

START_TIMEOUT_S = 300  # a hang guard: the loop ends when the service is up


@contextlib.contextmanager
def serving(db_url: str, token: str | None = None) -> Iterator[tuple[str, SQLStore]]:
    """(base URL, store) of the service over ``db_url``, run by uvicorn in a thread; stopped on exit."""
    store = SQLStore(db_url)
    config = uvicorn.Config(create_app(store, token=token), host="127.0.0.1", port=free_port(), log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tuning-db-test-service", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{config.port}", store
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        store.close()
        assert not thread.is_alive(), "the service did not stop"
