"""Layer scheduler (the online half of FineCo): pick each request's candidate-ID list.

When a request arrives the scheduler reads the monitor (what the other request streams will run
next). Idle device: the fastest candidate of every layer. Otherwise each layer's candidates are
scored by their estimated co-located time against the layer the other streams will be running
then, and the list with the least co-located time that meets the request's QoS is chosen.

Co-located time of candidate c while the others run candidates o1, o2, ...:
    latency(c) / (1 - min(sum_i overhead(c, o_i), MAX_OVERHEAD))
where overhead(c, o) is the profiled interference per unit time (`tvmsched profile-coloc`):
    r = (co-located latency of c - isolated latency of c) / overlap time.
Each unit of overlap delays c by r, so over a fully overlapped run T = latency + r T, i.e.
T = latency / (1 - r). Pairs never profiled take the mean of the profiled pairs with the same unit
counts, else the units' oversubscription: demand d = units(c) + units(o) above all units shares them
evenly, a slowdown of d / all, i.e. r = max(0, d - all) / d (candidates that fit beside each other
do not interfere).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import logging
import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

log = logging.getLogger(__name__)

MAX_OVERHEAD = 0.99  # interference per unit time is capped below 1 (which would never finish)
LOOKAHEAD_REQUESTS = 4  # queued requests of a stream the estimate looks at, besides the running one
DECISION_HISTORY = 10_000  # decisions LayerScheduler.decisions keeps (the latest); `decided` counts them all


@dataclass(frozen=True)
class CandidateInfo:
    units: int  # units it runs on (the device's all-unit count for full-unit candidates)
    latency_us: float  # isolated latency
    key: str  # profile key: "<model>/<kernel symbol>"


@dataclass(frozen=True)
class StreamView:
    """What the monitor knows of another running stream: its remaining layers' chosen candidates, in order."""

    name: str
    remaining: tuple[CandidateInfo, ...]


class Decision(NamedTuple):  # a tuple: one allocation per request (a frozen dataclass costs ~4x as much)
    model: str
    candidate_ids: tuple[int, ...]
    estimated_ms: float
    meets_qos: bool
    streams: int  # other streams running when it was decided
    seconds: float  # time the decision took


@dataclass
class ColocationTable:
    """Interference per unit time of candidate pairs.

    Lookup: the profiled pair itself; else the mean of the profiled pairs with the same unit counts
    (the profile covers each model's heaviest layer; `add_candidates` tells the table every loaded
    candidate's units); else `fallback`, the units' oversubscription.
    """

    total_units: int
    measured: dict[tuple[str, str], float] = field(default_factory=dict)
    units_of: dict[str, int] = field(default_factory=dict)  # candidate key -> units
    _by_units: dict[tuple[int, int], float] | None = field(default=None, repr=False)

    def add_candidates(self, candidates) -> None:
        self.units_of.update((c.key, c.units) for c in candidates)
        self._by_units = None

    def overhead(self, a: CandidateInfo, b: CandidateInfo) -> float:
        found = self.measured.get((a.key, b.key))
        if found is None:
            found = self.by_units().get((a.units, b.units))
        return found if found is not None else self.fallback(a, b)

    def by_units(self) -> dict[tuple[int, int], float]:
        """Mean profiled overhead per (units of the first, units of the second) candidate."""
        if self._by_units is None:
            groups: dict[tuple[int, int], list[float]] = {}
            for (first, second), value in self.measured.items():
                if first in self.units_of and second in self.units_of:
                    groups.setdefault((self.units_of[first], self.units_of[second]), []).append(value)
            self._by_units = {pair: sum(values) / len(values) for pair, values in groups.items()}
        return self._by_units

    def fallback(self, a: CandidateInfo, b: CandidateInfo) -> float:
        demand = a.units + b.units
        return max(0.0, (demand - self.total_units) / demand)

    def colocated_us(self, cand: CandidateInfo, running: list[CandidateInfo]) -> float:
        """Estimated time of `cand` while the `running` candidates run beside it throughout."""
        rate = min(sum(self.overhead(cand, other) for other in running), MAX_OVERHEAD)
        return cand.latency_us / (1 - rate)


class LayerScheduler:
    def __init__(self, table: ColocationTable):
        self.table = table
        # the latest decisions only: a list of every one grew by a tracked object per request, for ever (memory, and
        # ever costlier gen-2 garbage collections)
        self.decisions: collections.deque[Decision] = collections.deque(maxlen=DECISION_HISTORY)
        self.decided = 0  # decisions taken since it was created
        self._fastest_us: dict[str, float] = {}  # model -> latency of its fastest candidates

    def choose(self, model: str, layers: list[list[CandidateInfo]], qos_ms: float | None, others: list[StreamView],
               start_us: float = 0.0, fastest: tuple[int, ...] = ()) -> Decision:
        """The candidate-ID list for one request of `model` (layers[i] = candidates of layer i, by ID) that
        starts in `start_us` (its own stream's earlier requests run first); `fastest`: the fastest
        candidate of every layer when the caller keeps it."""
        start = time.perf_counter()
        others = [s for s in others if s.remaining]
        if not others:
            ids = fastest or [min(range(len(cands)), key=lambda c: cands[c].latency_us) for cands in layers]
            if fastest and model in self._fastest_us:
                estimate_us = start_us + self._fastest_us[model]
            else:
                estimate_us = start_us + sum(layers[i][c].latency_us for i, c in enumerate(ids))
                if fastest:
                    self._fastest_us[model] = estimate_us - start_us
        else:
            ids, estimate_us = self._least_colocated(layers, others, start_us)
        meets = qos_ms is None or estimate_us <= qos_ms * 1e3
        decision = Decision(model, tuple(ids), estimate_us / 1e3, meets, len(others), time.perf_counter() - start)
        self.decisions.append(decision)
        self.decided += 1
        if log.isEnabledFor(logging.INFO):
            log.info("schedule %s: ids %s, estimated %.3f ms (QoS %s ms%s), %d other streams, decided in %.1f us",
                     model, list(ids), decision.estimated_ms, qos_ms, "" if meets else ", AT RISK", len(others), decision.seconds * 1e6)
        return decision

    def _least_colocated(self, layers, others: list[StreamView], start_us: float) -> tuple[list[int], float]:
        """Greedy over the layers in order: each layer's candidate with the least co-located time
        against what every other stream runs at that moment (their remaining layers laid out in time)."""
        timelines = [_cumulative(s.remaining) for s in others]
        ids, now = [], start_us
        for cands in layers:
            running = [_at(timeline, now) for timeline in timelines]
            running = [c for c in running if c is not None]
            scored = [(self.table.colocated_us(cand, running), cid) for cid, cand in enumerate(cands)]
            cost, best = min(scored)
            ids.append(best)
            now += cost
        return ids, now


def stream_work(layers: list[list[CandidateInfo]], state, lookahead: int = LOOKAHEAD_REQUESTS) -> tuple[CandidateInfo, ...]:
    """What a stream will still run: its running request's remaining layers, then up to `lookahead`
    queued requests (each with its chosen candidates), from the monitor's StreamState."""
    work = list(remaining_work(layers, state.done, state.blocks, state.ids))
    for ids in state.queued[:lookahead]:
        work += [cands[ids[i] if ids else 0] for i, cands in enumerate(layers)]
    return tuple(work)


def remaining_work(layers: list[list[CandidateInfo]], done, blocks, ids: list[int] | None) -> tuple[CandidateInfo, ...]:
    """A running request's layers still to run, from its progress bitmap (done / all blocks per layer):
    a partly done layer keeps the share of its latency its remaining blocks stand for."""
    remaining = []
    for i, cands in enumerate(layers):
        cand = cands[ids[i] if ids else 0]
        left = 1.0 - min(max(int(done[i]), 0), int(blocks[i])) / int(blocks[i])
        if left > 0:
            remaining.append(cand if left == 1.0 else replace(cand, latency_us=cand.latency_us * left))
    return tuple(remaining)


def _cumulative(remaining: tuple[CandidateInfo, ...]) -> tuple[list[float], tuple[CandidateInfo, ...]]:
    """(end time of each remaining layer, the layers)."""
    return list(itertools.accumulate(c.latency_us for c in remaining)), remaining


def _at(timeline: tuple[list[float], tuple[CandidateInfo, ...]], t: float) -> CandidateInfo | None:
    """The candidate a stream runs at time t (us from now), None when it will have finished."""
    ends, cands = timeline
    index = bisect.bisect_right(ends, t)
    return cands[index] if index < len(cands) else None
