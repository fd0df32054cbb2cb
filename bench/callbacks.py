"""A Python done-callback and the requests behind it: does a callback waiting for the GIL hold up its stream?

A stream of a 16-layer chain of 8x8 MatMuls (a request takes a few µs) gets `--requests` requests queued at once, each
with a trivial `add_done_callback` (what `asyncio.wrap_future` adds in a server), while `--hogs` Python threads run
pure Python (a busy event loop: they hold the GIL and drop it only when CPython asks, every switch interval, 5 ms).
The engine's timestamps give the batch's span (first start to last finish) and so the stream's time per request.

    python -P bench/callbacks.py --out bench/results/raw/callbacks.json
    PYTHONPATH=/tmp/base python -P bench/callbacks.py ...   # another build of the package, the same measurement

Runs each configuration `--rounds` times; prints one JSON line per round and a summary (the median µs per request
of each configuration).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))  # bench/ is not a package: engine.py's chain


def one_round(task, inputs, requests: int, hogs: int, callbacks: bool) -> dict:
    stop = threading.Event()

    def hog():  # pure Python: holds the GIL until CPython asks for it (sys.getswitchinterval())
        x = 0
        while not stop.is_set():
            for i in range(1000):
                x += i * i

    threads = [threading.Thread(target=hog, daemon=True) for _ in range(hogs)]
    for thread in threads:
        thread.start()
    time.sleep(0.02)
    try:
        task.preempt(abort=False)  # the whole batch queued before any runs
        futures = [task.submit(inputs) for _ in range(requests)]
        if callbacks:
            for future in futures:
                future.add_done_callback(lambda _f: None)
        task.resume()
        for future in futures:
            future.result(timeout=120)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    span_us = max(f.request.finished_us for f in futures) - min(f.request.started_us for f in futures)
    return {"requests": requests, "hogs": hogs, "callbacks": callbacks, "span_ms": span_us / 1e3,
            "per_request_us": span_us / requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--hogs", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from engine import compile_chain  # MatMuls of [1, 8] x [8, 8], each its own layer
    from tvmsched.runtime import Executor
    from tvmsched.runtime.preemption import Task

    executor = Executor(compile_chain(Path(tempfile.mkdtemp(prefix="callbacks-")), 16, 8))
    inputs = executor.random_inputs(0)
    task = Task(executor, "chain")
    rows = []
    for _ in range(args.rounds):
        for hogs, callbacks in ((0, True), (args.hogs, False), (args.hogs, True)):
            rows.append({"label": args.label, **one_round(task, inputs, args.requests, hogs, callbacks)})
            print(json.dumps(rows[-1]), flush=True)
    task.close()
    summary = {}
    for hogs, callbacks in ((0, True), (args.hogs, False), (args.hogs, True)):
        mine = [r for r in rows if r["hogs"] == hogs and r["callbacks"] == callbacks]
        summary[f"hogs={hogs} callbacks={callbacks}"] = float(np.median([r["per_request_us"] for r in mine]))
    print(json.dumps({"label": args.label, "switch_interval_s": sys.getswitchinterval(), "summary": summary}))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"label": args.label, "rows": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
