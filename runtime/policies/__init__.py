"""Scheduling policies: they decide each request's candidate-ID list and never touch the device.

Every policy implements `choose(request) -> list[int]` over a `Request` view (the model's candidates,
its QoS, the monitor of the other streams, the device's units); `create(kind)` builds one:

    colocation  FineCo's layer scheduler: least co-located time against the other streams (scheduler.py)
    fastest     the fastest candidate of every layer, streams run concurrently
    partition   each model's fastest candidates within an even share of the units
    fcfs        fastest candidates, one request at a time in arrival order (`serial`: the time-sharing baseline)

Real-time over best-effort priorities (preempting) is the separate policy in `priority.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvmsched.errors import TvmschedError
from tvmsched.runtime.scheduler import CandidateInfo, ColocationTable, StreamView


@dataclass(frozen=True)
class Request:
    """What a policy sees of one request."""

    model: str
    layers: list[list[CandidateInfo]]  # layers[i][c]: candidate c of layer i (units are explicit counts)
    qos_ms: float | None
    monitor: Callable[[], dict[str, StreamView]]  # every busy stream's work still to run (read on demand)
    total_units: int
    loaded_models: int
    fastest: tuple[int, ...] = ()  # the fastest candidate of every layer (fastest_ids(layers), kept per model)
    choice: bool = True  # some layer has more than one candidate (else there is nothing to decide)
    stream: str = ""  # the monitor's name of the stream it goes to (a model on several streams: which one); "" = model

    @property
    def own_stream(self) -> str:
        return self.stream or self.model

    def fastest_ids(self) -> list[int]:
        return list(self.fastest) if self.fastest else fastest_ids(self.layers)


class Policy:
    """The interface: `choose` returns one candidate id per layer. `serial`: run requests one at a time."""

    kind = ""
    serial = False

    def choose(self, request: Request) -> list[int]:
        raise NotImplementedError


def fastest_ids(layers: list[list[CandidateInfo]]) -> list[int]:
    """The fastest candidate of every layer."""
    return [min(range(len(cands)), key=lambda c: cands[c].latency_us) for cands in layers]


def create(kind: str, *, table: ColocationTable | None = None, total_units: int = 1) -> Policy:
    """A policy by kind; `table` is the colocation profile (colocation only)."""
    from tvmsched.runtime.policies.colocation import ColocationPolicy
    from tvmsched.runtime.policies.fastest import FastestPolicy
    from tvmsched.runtime.policies.fcfs import FcfsPolicy
    from tvmsched.runtime.policies.partition import PartitionPolicy

    kinds = {"colocation": lambda: ColocationPolicy(table or ColocationTable(total_units)),
             "fastest": FastestPolicy, "partition": PartitionPolicy, "fcfs": FcfsPolicy}
    if kind not in kinds:
        raise TvmschedError(f"policy must be one of {tuple(kinds)}, not {kind!r}")
    return kinds[kind]()


KINDS = ("colocation", "fastest", "partition", "fcfs")
