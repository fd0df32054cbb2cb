"""Real-time over best-effort: a real-time request preempts every best-effort stream (an idle one is paused, so
that what it gets meanwhile waits); they resume when no real-time request is queued or running any more. A preempted request that started keeps its memory
(its sub-tasks, under a budget): when a switch-in waits for that memory, the requests holding it run to their
end and pause again (`memory_blocked`), rather than the real-time request waiting for the watchdog. Decides
only: the engine's preemption group (native.create_preemption_group) preempts and resumes, and
finish_started() is the stream's (runtime.preemption.Task)."""

from __future__ import annotations

from concurrent.futures import Future

from tvmsched.runtime import native


class Priorities:
    """Which requests are real-time and which streams best-effort: the engine's preemption group does the rest."""

    def __init__(self):
        # the mechanism: a real-time request holds it; its first holder preempts the best-effort streams (abort, not
        # waiting; idle ones paused), its last one's completion resumes them, both in the engine (no Python, no GIL)
        self._group = native.create_preemption_group()
        self.finished_for_memory = 0  # preempted requests let run to their end for a switch-in's memory

    @property
    def preempted(self) -> int:
        """Best-effort streams preempted, in all."""
        return int(self._group.preempted())

    @property
    def realtime_active(self) -> int:
        """Real-time requests queued or running."""
        return int(self._group.active())

    def add_best_effort(self, task) -> None:
        self._group.add(task.stream)  # preempted at once while a real-time request runs

    def remove_best_effort(self, task) -> None:
        """A best-effort task that is unloaded: no real-time request preempts or resumes it any more."""
        self._group.remove(task.stream)

    def submit_realtime(self, task, inputs: dict, candidate_ids: list[int] | None = None, deadline_us: float = 0) -> Future:
        """Queue a real-time request, then preempt the best-effort streams: their preemption is off the real-time
        request's path, which starts at once on its own (higher-priority) stream, and off the caller's (a server's
        event loop): the flag is set and the streams paused, and each stream's own thread waits for the launches it
        has in flight (preempt without waiting). They resume when no real-time request is queued or running, on the
        completing request's own thread in the engine. `task` may be a best-effort model's (a request of its asking
        for real time): its own stream is not preempted."""
        future = task.submit(inputs, candidate_ids, deadline_us) if deadline_us else task.submit(inputs, candidate_ids)
        request = getattr(future, "request", None)  # an EngineFuture's; none: refused before the engine's queue
        if request is not None:
            self._group.hold(request, task.stream)
        return future

    def memory_blocked(self, waiting, holders: list) -> None:
        """The switcher: `waiting`'s switch-in waits for memory that the started requests of the paused models
        `holders` (engine models) keep. Those this policy paused for real-time work finish their request and pause
        again."""
        # (paused by someone else, not by real-time work: theirs to resume; the group does nothing then)
        self.finished_for_memory += int(self._group.finish_started_of(list(holders)))
