"""MetaSchedule's worker pools, kept for the next tuning in the same process.

Each build worker is a process that imports TVM (about 1 CPU-second), and a tuning starts a pool of them
(`search.pooled_builder`: one per core). A tuning that ends gives its pool back here: the next tuning in this process
with the same kind of pool (its key: the timeout and the worker count) takes it instead of starting its workers
again. A pool unused for IDLE_S is shut down, so a long-running process does not keep TVM's
memory in idle workers; the workers die with the process in any case (`search.die_with_parent`).

A pool is leased to one tuning at a time: two tunings at once in one process each get a pool of their own.
"""

from __future__ import annotations

import atexit
import os
import threading

IDLE_S = 30.0  # a pool given back and not taken again within this long is shut down

_lock = threading.Lock()
_idle: dict[tuple, tuple[object, threading.Timer]] = {}  # key -> (pool, the timer that shuts it down)


def take(key: tuple, make):
    """An idle pool of `key` (this process's), else `make()`'s new one."""
    key = (os.getpid(), *key)  # (a forked child never takes its parent's workers)
    with _lock:
        found = _idle.pop(key, None)
    if found is None:
        return make()
    pool, timer = found
    timer.cancel()
    return pool


def give_back(key: tuple, pool) -> None:
    """`pool` is idle: kept for the next `take(key)`, shut down after IDLE_S (at once if one of `key` is kept)."""
    key = (os.getpid(), *key)
    with _lock:
        keep = key not in _idle
        if keep:
            timer = threading.Timer(IDLE_S, _expire, (key, pool))
            timer.daemon = True
            _idle[key] = (pool, timer)
            timer.start()
    if not keep:
        pool.shutdown(wait=False)


def _expire(key: tuple, pool) -> None:
    with _lock:
        if key not in _idle or _idle[key][0] is not pool:
            return  # taken again meanwhile
        del _idle[key]
    pool.shutdown(wait=False)


@atexit.register
def shutdown_idle() -> None:
    """Shut every idle pool down now."""
    with _lock:
        found = list(_idle.values())
        _idle.clear()
    for pool, timer in found:
        timer.cancel()
        pool.shutdown(wait=False)
