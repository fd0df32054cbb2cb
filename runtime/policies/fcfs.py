"""One request at a time in arrival order, fastest candidates (the time-sharing baseline)."""

from __future__ import annotations

from tvmsched.runtime.policies import Policy, Request


class FcfsPolicy(Policy):
    kind = "fcfs"
    serial = True

    def choose(self, request: Request) -> list[int]:
        return request.fastest_ids()
