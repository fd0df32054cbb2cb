"""The fastest candidate of every layer; streams run concurrently (the MPS-like baseline)."""

from __future__ import annotations

from tvmsched.runtime.policies import Policy, Request


class FastestPolicy(Policy):
    kind = "fastest"

    def choose(self, request: Request) -> list[int]:
        return request.fastest_ids()
