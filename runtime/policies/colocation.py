"""FineCo's online half: the layer scheduler over the resource monitor (rules in docs/runtime.md)."""

from __future__ import annotations

from tvmsched.runtime.policies import Policy, Request
from tvmsched.runtime.scheduler import ColocationTable, LayerScheduler


class ColocationPolicy(Policy):
    """Idle device: fastest candidates; otherwise the least co-located time within the QoS."""

    kind = "colocation"

    def __init__(self, table: ColocationTable):
        self.scheduler = LayerScheduler(table)

    def choose(self, request: Request) -> list[int]:
        if not request.choice:
            # one candidate per layer: nothing to decide, so no monitor to read (under load, reading it and the greedy
            # pass cost more than the requests themselves: bench/results/sharing-cpu.md)
            return request.fastest_ids()
        views = request.monitor()
        own = views.pop(request.own_stream, None)  # it starts when its stream's earlier work is done; the model's other
        # streams (Runtime.load(streams=)) run beside it like any other
        start_us = sum(c.latency_us for c in own.remaining) if own else 0.0
        decision = self.scheduler.choose(request.model, request.layers, request.qos_ms, list(views.values()), start_us,
                                         fastest=request.fastest)
        return list(decision.candidate_ids)
