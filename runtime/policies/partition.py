"""Static partition: each model's fastest candidates within an even share of the units."""

from __future__ import annotations

from tvmsched.runtime.policies import Policy, Request


class PartitionPolicy(Policy):
    kind = "partition"

    def __init__(self):
        self._chosen: dict[tuple[str, int], list[int]] = {}  # (model, share) -> ids

    def choose(self, request: Request) -> list[int]:
        share = max(1, request.total_units // max(1, request.loaded_models))
        key = (request.model, share)
        if key not in self._chosen:
            self._chosen[key] = self._within(request.layers, share)
        return list(self._chosen[key])

    @staticmethod
    def _within(layers, share: int) -> list[int]:
        ids = []
        for cands in layers:
            fits = [c for c in range(len(cands)) if cands[c].units <= share] or list(range(len(cands)))
            ids.append(min(fits, key=lambda c: cands[c].latency_us))
        return ids
