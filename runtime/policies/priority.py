"""Real-time over best-effort: a real-time request preempts every busy best-effort stream; they resume
when no real-time request is queued or running any more. Decides only; preempt()/resume() are the
engine's mechanism (runtime.preemption.Task)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

KEEP_PREEMPTIONS = 1024  # reports `preemptions` keeps (the latest; past twice as many the oldest go)


class Priorities:
    def __init__(self):
        self._lock = threading.Lock()
        self._best_effort: list = []  # Tasks
        self._realtime_active = 0
        # the latest PreemptReports, KEEP_PREEMPTIONS to twice as many (a server runs for long: ~250 B each, kept
        # for ever before); `preempted` counts them all
        self.preemptions: list = []
        self.preempted = 0

    def add_best_effort(self, task) -> None:
        with self._lock:
            self._best_effort.append(task)
            if self._realtime_active:
                self._record(task.preempt())

    def _record(self, report) -> None:  # under self._lock
        if len(self.preemptions) >= 2 * KEEP_PREEMPTIONS:
            del self.preemptions[:-KEEP_PREEMPTIONS]
        self.preemptions.append(report)
        self.preempted += 1

    def submit_realtime(self, task, inputs: dict, candidate_ids: list[int] | None = None) -> Future:
        with self._lock:
            self._realtime_active += 1
            if self._realtime_active == 1:
                for best_effort in self._best_effort:
                    if best_effort.busy:
                        self._record(best_effort.preempt())
        try:
            future = task.submit(inputs, candidate_ids)
        except Exception:
            self._realtime_done(None)
            raise
        future.add_done_callback(self._realtime_done)
        return future

    def _realtime_done(self, _future) -> None:
        with self._lock:
            self._realtime_active -= 1
            if self._realtime_active == 0:
                for best_effort in self._best_effort:
                    best_effort.resume()
