"""Real-time over best-effort: a real-time request preempts every busy best-effort stream; they resume
when no real-time request is queued or running any more. A preempted request that started keeps its memory
(its sub-tasks, under a budget): when a switch-in waits for that memory, the requests holding it run to their
end and pause again (`memory_blocked`), rather than the real-time request waiting for the watchdog. Decides
only; preempt()/resume()/finish_started() are the engine's mechanism (runtime.preemption.Task)."""

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
        self.finished_for_memory = 0  # preempted requests let run to their end for a switch-in's memory

    def add_best_effort(self, task) -> None:
        with self._lock:
            self._best_effort.append(task)
            if self._realtime_active:
                self._record(task.preempt(wait=False))

    def remove_best_effort(self, task) -> None:
        """A best-effort task that is unloaded: no real-time request preempts or resumes it any more."""
        with self._lock:
            if task in self._best_effort:
                self._best_effort.remove(task)

    def _record(self, report) -> None:  # under self._lock
        if len(self.preemptions) >= 2 * KEEP_PREEMPTIONS:
            del self.preemptions[:-KEEP_PREEMPTIONS]
        self.preemptions.append(report)
        self.preempted += 1

    def submit_realtime(self, task, inputs: dict, candidate_ids: list[int] | None = None, deadline_us: float = 0) -> Future:
        """Queue a real-time request, then preempt the busy best-effort streams: their preemption is off the real-time
        request's path, which starts at once on its own (higher-priority) stream, and off the caller's (a server's
        event loop): the flag is set and the streams paused, and each stream's own thread waits for the launches it
        has in flight (Task.preempt(wait=False)). They resume when no real-time request is queued or running. `task`
        may be a best-effort model's (a request of its asking for real time): its own stream is not preempted."""
        with self._lock:
            self._realtime_active += 1
            first = self._realtime_active == 1
        try:
            future = task.submit(inputs, candidate_ids, deadline_us) if deadline_us else task.submit(inputs, candidate_ids)
        except Exception:
            self._realtime_done(None)
            raise
        if first:  # still active: _realtime_done is not registered yet, so nothing resumed them meanwhile
            with self._lock:
                for best_effort in self._best_effort:
                    if best_effort is not task and best_effort.busy:  # a best-effort model's real-time request
                        self._record(best_effort.preempt(wait=False))
        future.add_done_callback(self._realtime_done)
        return future

    def _realtime_done(self, _future) -> None:
        with self._lock:
            self._realtime_active -= 1
            if self._realtime_active == 0:
                for best_effort in self._best_effort:
                    best_effort.resume()

    def memory_blocked(self, waiting, holders: list) -> None:
        """The switcher: `waiting`'s switch-in waits for memory that the started requests of the paused models
        `holders` (engine models) keep. Those this policy paused for real-time work finish their request and pause
        again."""
        with self._lock:
            if not self._realtime_active:
                return  # paused by someone else (Task.preempt): theirs to resume
            for task in self._best_effort:
                if any(task.executor.native.same_as(h) for h in holders) and task.finish_started():
                    self.finished_for_memory += 1
