"""The discrete-event core of the collectives simulator: jobs' steps and AllReduces, and who aggregates.

Each job runs steps; a step launches its buckets' AllReduces at their ready times, one collective in
flight per job (a later bucket queues behind an earlier one), and ends at max(compute end, last
AllReduce end) (MINA's model). An AllReduce runs in-network while it holds every switch of the job's
aggregation tree, or as ring AllReduce. Policies:

    tdm        mechanism E with score.calc_score: (1) a switch of the tree is in use by another job ->
               ring; (2) no other job's AllReduce expected while it would run -> in-network; (3) else
               the highest score among it and every AllReduce expected during it (each sharing job's
               ops predicted from its state, the rest assumed ring) -> in-network only if it is the top
    mina       the same decision with score.mina_score (MINA's priority ratio)
    greedy     in-network whenever the tree's switches are free (MINA's greedy sharing, no score)
    exclusive  SHARP's default: a job that finds its tree's switches free at start holds them for its
               lifetime (every AllReduce in-network); the others never aggregate in the network
    spatial    ATP-style: every AllReduce aggregates in the network; k concurrent users of a switch
               each get 1/k of its bandwidth (a tree runs at the rate of its most shared switch)
    none       ring AllReduce only
    ideal      every job aggregates in the network with the switches to itself

Aggregation: a job whose tree shares no switch with another running job's tree cannot contend, so its
step is one event with a precomputed duration; when a job sharing a switch arrives, the step in flight
is reconstructed op by op (exact: the all-in-network timeline of a step is known). Only jobs that
share switches pay one to two events per AllReduce.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass

from tvmsched.runtime.collectives import score as scores
from tvmsched.runtime.collectives.workloads import Profile, step_time

POLICIES = ("tdm", "exclusive", "spatial", "mina", "greedy", "none", "ideal")
SHARING = ("tdm", "mina", "greedy", "spatial")  # policies that share switches op by op
SCORED = {"tdm": scores.calc_score, "mina": scores.mina_score}
FAST_END, STEP_END, OP_START, OP_END, ARRIVE = range(5)


@dataclass(frozen=True)
class Timing:
    """A job's step under a network: each AllReduce's ring and in-network durations, and derived times.

    `tail_a`/`tail_b`: if AllReduce i ends at relative time x and the later ones run ring, the step
    ends at max(x + tail_a[i], tail_b[i]) (max-plus composition of the chain; exposed savings in O(1)).
    """

    profile: Profile
    ring: tuple[float, ...]
    innet: tuple[float, ...]
    tail_a: tuple[float, ...]
    tail_b: tuple[float, ...]
    in_starts: tuple[float, ...]  # all-in-network timeline, relative to the step's start
    in_ends: tuple[float, ...]
    step_ring: float
    step_innet: float
    nominal: tuple[float, ...]  # each op's exposed fraction at its place in the all-in-network timeline

    @property
    def exposure(self) -> float:
        """Fraction of the ring step that in-network aggregation saves (0: communication hidden)."""
        return (self.step_ring - self.step_innet) / self.step_ring if self.step_ring > 0 else 0.0


def timing(p: Profile, ring: list[float], innet: list[float]) -> Timing:
    """`p`'s step with AllReduce i taking ring[i] as ring AllReduce and innet[i] in the network."""
    n = len(p.sizes)
    a, b = [0.0] * n, [p.sync] * n
    for i in range(n - 2, -1, -1):
        d = ring[i + 1]
        a[i] = d + a[i + 1]
        b[i] = max(p.starts[i + 1] + d + a[i + 1], b[i + 1])
    starts, ends, t = [], [], 0.0
    for s, d in zip(p.starts, innet):
        starts.append(max(t, s))
        t = starts[-1] + d
        ends.append(t)
    nominal = tuple(_exposed(x, r, d, ai, bi) for x, r, d, ai, bi in zip(starts, ring, innet, a, b))
    return Timing(p, tuple(ring), tuple(innet), tuple(a), tuple(b), tuple(starts), tuple(ends),
                  step_time(p, ring), max(t, p.sync), nominal)


def _exposed(x: float, ring: float, innet: float, a: float, b: float) -> float:
    """Exposed fraction of an op's saving when it starts at relative time x and the rest run ring."""
    if ring <= innet:
        return 0.0
    return (max(x + ring + a, b) - max(x + innet + a, b)) / (ring - innet)


class Run:
    """One job's state in the simulation (mutable; the engine's inner loop reads it directly)."""

    __slots__ = ("id", "name", "tm", "hosts", "steps", "steps_left", "tree", "arrival", "start", "end",
                 "step_start", "op", "t_free", "fast", "fast_innet", "gen", "ev_kind", "ev_time", "nb",
                 "nb_dirty", "holds", "innet_bytes", "ring_bytes", "innet_ops", "work", "rate", "t_last",
                 "placed")

    def __init__(self, rid: int, name: str, tm: Timing, hosts: int, steps: int, arrival: float = 0.0):
        self.id, self.name, self.tm, self.hosts, self.steps = rid, name, tm, hosts, steps
        self.steps_left, self.tree, self.arrival = steps, (), arrival
        self.start = self.end = math.nan
        self.step_start = self.t_free = self.ev_time = 0.0
        self.op = self.gen = self.ev_kind = self.innet_ops = 0
        self.fast = self.fast_innet = self.holds = False
        self.nb, self.nb_dirty = [], True
        self.innet_bytes = self.ring_bytes = 0
        self.work = self.rate = self.t_last = 0.0
        self.placed: list[int] = []


class Engine:
    """Runs jobs over switches under one policy; `on_finish(run, now)` may start more jobs."""

    def __init__(self, policy: str, switches: int, on_finish: Callable[[Run, float], None] = lambda r, t: None):
        self.policy = policy
        self.score = SCORED.get(policy)
        self.nominal = policy == "tdm"  # see `op`
        self.on_finish = on_finish
        self.holder = [-1] * switches  # job holding a switch's aggregation (tdm, mina, exclusive)
        self.until = [0.0] * switches  # when that hold ends (tdm, mina)
        self.users: list[set[int]] = [set() for _ in range(switches)]  # running jobs whose tree has it
        self.active: list[set[int]] = [set() for _ in range(switches)]  # spatial: ops aggregating there
        self.runs: dict[int, Run] = {}
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0

    # -- events ------------------------------------------------------------------------------------

    def push(self, r: Run, t: float, kind: int) -> None:
        self.seq += 1
        r.ev_kind, r.ev_time = kind, t
        heapq.heappush(self.heap, (t, self.seq, r.id, r.gen, kind))

    def arrive_at(self, r: Run) -> None:
        self.runs[r.id] = r
        self.push(r, r.arrival, ARRIVE)

    def run(self, on_arrive: Callable[[Run, float], None] | None = None) -> None:
        heap, runs = self.heap, self.runs
        while heap:
            t, _, rid, gen, kind = heapq.heappop(heap)
            r = runs.get(rid)
            if r is None or gen != r.gen:  # superseded (a reconstructed step, a re-timed spatial op)
                continue
            self.now = t
            if kind == OP_START:
                self._op_start(r, t)
            elif kind == OP_END:
                self._op_end(r, t)
            elif kind == FAST_END:
                self._account_step(r, r.fast_innet)
                self._step_done(r, t)
            elif kind == STEP_END:
                self._step_done(r, t)
            elif on_arrive is not None:
                on_arrive(r, t)

    # -- jobs --------------------------------------------------------------------------------------

    def start(self, r: Run, t: float, tree: tuple[int, ...]) -> None:
        """Start `r` at `t` on `tree` (() for none); under exclusive, `r.holds` says it got the tree."""
        self.runs[r.id] = r
        r.tree, r.start = tree, t
        for s in tree:
            self.users[s].add(r.id)
        if r.holds:
            for s in tree:
                self.holder[s] = r.id
        for k in self._touch(r):
            if k.fast and k.fast_innet and self.policy in SHARING:
                self._materialize(k, t)
        self._begin_step(r, t)

    def _touch(self, r: Run) -> list[Run]:
        """Mark the neighbour lists of the jobs sharing a switch with `r` stale; return those jobs."""
        ids = set()
        for s in r.tree:
            ids |= self.users[s]
        ids.discard(r.id)
        r.nb_dirty = True
        out = [self.runs[i] for i in sorted(ids)]
        for k in out:
            k.nb_dirty = True
        return out

    def neighbours(self, r: Run) -> list[Run]:
        if r.nb_dirty:
            ids = set()
            for s in r.tree:
                ids |= self.users[s]
            ids.discard(r.id)
            r.nb, r.nb_dirty = [self.runs[i] for i in sorted(ids)], False
        return r.nb

    def _finish(self, r: Run, t: float) -> None:
        r.end = t
        self._touch(r)
        for s in r.tree:
            self.users[s].discard(r.id)
            if self.holder[s] == r.id:
                self.holder[s] = -1
        del self.runs[r.id]
        self.on_finish(r, t)

    def _step_done(self, r: Run, t: float) -> None:
        r.steps_left -= 1
        if r.steps_left == 0:
            self._finish(r, t)
        else:
            self._begin_step(r, t)

    def _begin_step(self, r: Run, t: float) -> None:
        r.step_start = t
        if self.policy in ("none", "ideal", "exclusive") or not r.tree or not self.neighbours(r):
            r.fast = True
            r.fast_innet = self._fast_innet(r)
            self.push(r, t + (r.tm.step_innet if r.fast_innet else r.tm.step_ring), FAST_END)
        else:
            r.fast, r.op, r.t_free = False, 0, t
            self.push(r, t + r.tm.profile.starts[0], OP_START)

    def _fast_innet(self, r: Run) -> bool:
        if self.policy == "ideal":
            return r.hosts > 1
        if self.policy == "exclusive":
            return r.holds
        return self.policy != "none" and bool(r.tree)

    def _account_step(self, r: Run, innet: bool) -> None:
        if r.hosts <= 1:
            return
        total = sum(r.tm.profile.sizes)
        if innet:
            r.innet_bytes += total
            r.innet_ops += len(r.tm.profile.sizes)
        else:
            r.ring_bytes += total

    def _materialize(self, k: Run, t: float) -> None:
        """Turn `k`'s one-event (all in-network) step into per-AllReduce events from time `t` on."""
        tm, rel = k.tm, t - k.step_start
        i = bisect_right(tm.in_ends, rel)
        sizes = tm.profile.sizes
        k.innet_bytes += sum(sizes[:i])
        k.innet_ops += i
        k.fast = False
        k.gen += 1
        if i == len(sizes):
            self.push(k, k.step_start + tm.step_innet, STEP_END)
        elif tm.in_starts[i] <= rel:
            k.op = i
            self._hold(k, t, k.step_start + tm.in_ends[i] - t)
        else:
            k.op = i
            k.t_free = k.step_start + (tm.in_ends[i - 1] if i else 0.0)
            self.push(k, k.step_start + tm.in_starts[i], OP_START)

    # -- AllReduces --------------------------------------------------------------------------------

    def _op_start(self, r: Run, t: float) -> None:
        i = r.op
        if self._decide(r, i, t):
            self._hold(r, t, r.tm.innet[i])
        else:
            r.ring_bytes += r.tm.profile.sizes[i] if r.hosts > 1 else 0
            self._advance(r, t + r.tm.ring[i])

    def _op_end(self, r: Run, t: float) -> None:
        if self.policy == "spatial":
            self._spatial_leave(r, t)
        else:
            for s in r.tree:
                self.holder[s] = -1
        r.innet_bytes += r.tm.profile.sizes[r.op]
        r.innet_ops += 1
        self._advance(r, t)

    def _advance(self, r: Run, free: float) -> None:
        """The op `r.op` ends at `free`: queue the next one, or the end of the step."""
        p = r.tm.profile
        r.t_free, r.op = free, r.op + 1
        if r.op < len(p.sizes):
            self.push(r, max(free, r.step_start + p.starts[r.op]), OP_START)
        else:
            self.push(r, max(free, r.step_start + p.sync), STEP_END)

    def _hold(self, r: Run, t: float, duration: float) -> None:
        if self.policy == "spatial":
            self._spatial_join(r, t, duration)
            return
        for s in r.tree:
            self.holder[s] = r.id
            self.until[s] = t + duration
        self.push(r, t + duration, OP_END)

    def _decide(self, r: Run, i: int, t: float) -> bool:
        if not r.tree or self.policy == "none":
            return False
        if self.policy == "spatial":
            return True
        holder = self.holder
        for s in r.tree:
            if holder[s] >= 0:
                return False
        if self.score is None:  # greedy
            return True
        end = t + r.tm.innet[i]
        mine = None
        for k in self.neighbours(r):
            for ta, ki, kss, kleft in self._arrivals(k, t, end):
                if self._blocked(k, ta):
                    continue
                if mine is None:
                    mine = scores.order_key(self.op(r, i, t, r.step_start, r.steps_left, t), self.score)
                if scores.order_key(self.op(k, ki, ta, kss, kleft, t), self.score) < mine:
                    return False
        return True

    def _blocked(self, k: Run, ta: float) -> bool:
        """Whether a switch of `k`'s tree is held past `ta` by a third job (k would run ring anyway)."""
        holder, until = self.holder, self.until
        return any(holder[s] >= 0 and until[s] > ta for s in k.tree)

    def _arrivals(self, k: Run, now: float, end: float):
        """`k`'s AllReduces that become ready in [now, end): (time, op, step start, steps left incl.)."""
        p, tm = k.tm.profile, k.tm
        n, left, ss = len(p.sizes), k.steps_left, k.step_start
        if k.ev_kind == OP_START:
            t, i = k.ev_time, k.op
        elif k.ev_kind == OP_END:  # k aggregates elsewhere (not on our switches): its next op
            i = k.op + 1
            if i == n:
                ss, i, left = max(k.ev_time, ss + p.sync), 0, left - 1
            t = max(k.ev_time, ss + p.starts[i])
        else:  # end of step pending
            ss, i, left = k.ev_time, 0, left - 1
            t = ss + p.starts[0]
        while left > 0 and t < end:
            yield t, i, ss, left
            free, i = t + tm.ring[i], i + 1
            if i == n:
                ss, i, left = max(free, ss + p.sync), 0, left - 1
            t = max(free, ss + p.starts[i])

    def op(self, k: Run, i: int, ta: float, ss: float, left: int, now: float) -> scores.Op:
        """The score's view of `k`'s AllReduce `i`, ready at `ta` in the step that began at `ss`.

        MINA scores the exposure of the op where it is now (delays included). tdm passes the op's
        exposure in the job's uncontended step instead: a job that lost the switch is late, which
        raises its current exposure, so it would win next time and two identical jobs would take turns
        losing forever; with the uncontended exposure, equal ops are decided by arrival (the wait in
        the score), the loser stays behind and its phase drifts clear of the winner's in a step or two.
        """
        tm = k.tm
        ring, innet = tm.ring[i], tm.innet[i]
        a, b, x = tm.tail_a[i], tm.tail_b[i], ta - ss
        exposed = tm.nominal[i] if self.nominal else _exposed(x, ring, innet, a, b)
        remaining = ss + max(x + ring + a, b) - now + (left - 1) * tm.step_ring
        return scores.Op(str(k.id), ring, innet, exposed, remaining, k.hosts, ta - now)

    # -- spatial sharing (processor sharing at the most shared switch) -----------------------------

    def _spatial_join(self, r: Run, t: float, work: float) -> None:
        r.work, r.rate, r.t_last = work, 0.0, t
        for s in r.tree:
            self.active[s].add(r.id)
        self._reschedule(r.tree, t)

    def _spatial_leave(self, r: Run, t: float) -> None:
        for s in r.tree:
            self.active[s].discard(r.id)
        r.rate = 0.0
        self._reschedule(r.tree, t)

    def _reschedule(self, tree: tuple[int, ...], t: float) -> None:
        ids = set()
        for s in tree:
            ids |= self.active[s]
        for j in sorted(ids):
            x = self.runs[j]
            x.work -= (t - x.t_last) * x.rate
            x.t_last = t
            x.rate = 1.0 / max(len(self.active[s]) for s in x.tree)
            x.gen += 1
            self.push(x, t + max(x.work, 0.0) / x.rate, OP_END)
