"""Static partition: each model's fastest candidates within an even share of the units."""

from __future__ import annotations

from tvmsched.runtime.policies import Policy, Request


class PartitionPolicy(Policy):
    kind = "partition"

    def choose(self, request: Request) -> list[int]:
        share = max(1, request.total_units // max(1, request.loaded_models))
        ids = []
        for cands in request.layers:
            fits = [c for c in range(len(cands)) if cands[c].units <= share] or list(range(len(cands)))
            ids.append(min(fits, key=lambda c: cands[c].latency_us))
        return ids
