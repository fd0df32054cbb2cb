"""Which AllReduce gets the switch (mechanism E's decision): a policy, computed locally from agreed state.

Every rank of a job must reach the same decision for every AllReduce, without a round trip per
AllReduce. So `decide(state, job, seq)` is a pure function of the state the controller's consensus
round made every rank of the job apply (`SwitchState`) and of the AllReduce's sequence number, which
all ranks of a data-parallel job share. Wall-clock time never enters it: where the method asks
"is another job using the switch now / will one arrive during this AllReduce", the answer comes from
the agreed timelines — each job's per-step AllReduce profile (offsets, sizes, ring and in-network
durations, as its agents measured them) anchored at a reference step (`ref_seq`, `ref_time`) that the
controller took from the job's own report. Predictions can be wrong (jobs drift); the switch's own
one-slot lock then refuses the late job's operation for all of its ranks at once (they run ring), and
the controller re-anchors the timelines at its next round.

The rule, as mechanism E states it, for AllReduce `seq` of job J (window [start, start + innet_s)):
(1) an AllReduce of another job predicted to hold the switch when J's starts, (2) none of another job
predicted during J's window → J takes it, (3) else CalcScore (score.py) for J's and every overlapping
one; the highest takes it, the others run ring at once (they never wait). (1) and (3) are one test:
J takes the switch iff it ranks before every overlapping AllReduce of another job (score.order_key:
higher score, then shorter remaining time, then smaller job id) — an earlier one that beat J holds it now, an earlier one that lost to J ran ring. The test is
pairwise, so two overlapping predicted AllReduces never both take the switch.

Policies (`SwitchState.policy`): `tdm` (this rule with score.calc_score), `mina` (the same rule with
MINA's score), `exclusive` (SHARP's default: `owner` holds the switch, every other job runs ring),
`spatial` (every job aggregates in the network, the switch divides its bandwidth), `none` (ring only).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass, field

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives.score import Op, calc_score, mina_score, order_key

POLICIES = ("tdm", "mina", "exclusive", "spatial", "none")


@dataclass(frozen=True)
class OpTiming:
    """One AllReduce of a training step as measured: its offset from the step's first AllReduce being
    ready, its size, its ring and in-network durations and the fraction of the saving the step sees."""

    offset_s: float
    nbytes: int
    ring_s: float
    innet_s: float
    exposed: float = 1.0


@dataclass(frozen=True)
class Profile:
    """A job's AllReduces in one step (its DDP buckets in launch order) and the step's period."""

    step_s: float
    ops: tuple[OpTiming, ...]
    hosts: int = 2
    steps_left: int | None = None

    def __post_init__(self) -> None:
        numbers = [self.step_s] + [x for o in self.ops for x in (o.offset_s, o.ring_s, o.innet_s, o.exposed, o.nbytes)]
        if not self.ops or not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in numbers) or self.step_s <= 0:
            raise TvmschedError("a profile needs a positive step time and at least one AllReduce with finite, non-negative timings")

    @functools.cached_property
    def reach_s(self) -> float:
        """How far past its step's first AllReduce the step's last in-network window ends."""
        return max(o.offset_s + o.innet_s for o in self.ops)

    @staticmethod
    def from_json(obj: dict) -> Profile:
        """The inverse of dataclasses.asdict (a report on the wire, a state's entry)."""
        return Profile(step_s=float(obj["step_s"]), ops=tuple(OpTiming(**o) for o in obj["ops"]),
                       hosts=int(obj["hosts"]), steps_left=obj.get("steps_left"))

    @staticmethod
    def measured(step_s: float, ready: list[float], nbytes: list[int], ring_s: list[float],
                 innet_s: list[float], hosts: int, steps_left: int | None = None) -> Profile:
        """A profile from one step's measurements (`ready`: when each AllReduce was handed to the agent,
        seconds from the step's first). `exposed` is 1 for an AllReduce whose saving reaches the step's
        end: the queue of ring AllReduces after it never idles, so finishing it earlier moves every later
        one (and the step) earlier; 0 where a later AllReduce waits for its gradients anyway."""
        finish, exposed = [], []
        t = 0.0
        for r, d in zip(ready, ring_s):
            t = max(t, r) + d
            finish.append(t)
        n = len(ready)
        tail_busy = True  # whether every AllReduce after i starts the moment its predecessor finishes
        for i in range(n - 1, -1, -1):
            exposed.append(1.0 if tail_busy else 0.0)
            if i > 0:
                tail_busy = tail_busy and ready[i] <= finish[i - 1]
        exposed.reverse()
        ops = tuple(OpTiming(float(o), int(b), float(r), float(x), e)
                    for o, b, r, x, e in zip(ready, nbytes, ring_s, innet_s, exposed))
        return Profile(step_s=float(step_s), ops=ops, hosts=hosts, steps_left=steps_left)


@dataclass(frozen=True)
class JobState:
    """What every rank agrees about one job sharing the switch."""

    job: str
    profile: Profile | None  # None until the job reported one: its AllReduces run ring
    ref_seq: int = 0  # the sequence number of the first AllReduce of a step ...
    ref_time: float = 0.0  # ... and when it was ready (the anchor of the job's predicted timeline)
    eff_seq: int = 0  # the state applies to this job's AllReduces from this sequence number ...
    lease_seq: int = -1  # ... through this one; later ones run ring until a new state is agreed


@dataclass(frozen=True)
class SwitchState:
    version: int = 0
    policy: str = "none"
    jobs: tuple[JobState, ...] = ()
    owner: str | None = None  # exclusive: the job holding the switch
    _by_job: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise TvmschedError(f"unknown collectives policy {self.policy!r} (valid: {', '.join(POLICIES)})")
        self._by_job.update({j.job: j for j in self.jobs})

    def job(self, name: str) -> JobState | None:
        return self._by_job.get(name)

    def to_json(self) -> dict:
        return {"version": self.version, "policy": self.policy, "owner": self.owner,
                "jobs": [asdict(j) for j in self.jobs]}

    @staticmethod
    def from_json(obj: dict) -> SwitchState:
        jobs = tuple(JobState(job=str(j["job"]), profile=None if j["profile"] is None else Profile.from_json(j["profile"]), ref_seq=int(j["ref_seq"]),
                              ref_time=float(j["ref_time"]), eff_seq=int(j["eff_seq"]), lease_seq=int(j["lease_seq"]))
                     for j in obj["jobs"])
        return SwitchState(version=int(obj["version"]), policy=str(obj["policy"]), jobs=jobs, owner=obj.get("owner"))


@dataclass(frozen=True)
class Decision:
    innet: bool
    reason: str


_RING_NO_STATE = Decision(False, "job not in the agreed state")


def decide(state: SwitchState, job: str, seq: int) -> Decision:
    """In-network or ring for AllReduce `seq` of `job`, from the agreed state alone (see the module doc)."""
    me = state.job(job)
    if me is None:
        return _RING_NO_STATE
    if seq < me.eff_seq or seq > me.lease_seq:
        return Decision(False, "outside the agreed lease")
    policy = state.policy
    if policy == "none":
        return Decision(False, "policy none")
    if policy == "spatial":
        return Decision(True, "spatial share")
    if policy == "exclusive":
        return Decision(state.owner == job, "owner" if state.owner == job else f"held by {state.owner}")
    if me.profile is None or not me.profile.ops:
        return Decision(False, "no profile yet")
    start, op = _predicted(me, seq)
    end = start + op.innet_s
    score = calc_score if policy == "tdm" else mina_score
    mine = order_key(_op(me, seq, op), score)
    rivals = 0
    for other in state.jobs:
        if other.job == job or other.profile is None or not other.profile.ops:
            continue
        for oseq, oop in _overlapping(other, start, end):
            rivals += 1
            if order_key(_op(other, oseq, oop), score) < mine:
                return Decision(False, f"{other.job}#{oseq} scores higher")
    return Decision(True, "free" if not rivals else f"highest of {rivals + 1}")


def _predicted(js: JobState, seq: int) -> tuple[float, OpTiming]:
    prof = js.profile
    step, i = divmod(seq - js.ref_seq, len(prof.ops))
    op = prof.ops[i]
    return js.ref_time + step * prof.step_s + op.offset_s, op


def _overlapping(js: JobState, start: float, end: float):
    """(seq, timing) of the job's predicted AllReduces whose in-network window meets [start, end),
    within its lease."""
    prof = js.profile
    n = len(prof.ops)
    period = max(prof.step_s, 1e-9)
    first = math.floor((start - prof.reach_s - js.ref_time) / period)
    last = math.ceil((end - js.ref_time) / period)
    first = max(first, last - 64)  # (an AllReduce never spans more steps than this)
    for step in range(first, last + 1):
        base = js.ref_time + step * period
        for i, o in enumerate(prof.ops):
            seq = js.ref_seq + step * n + i
            if seq < js.eff_seq or seq > js.lease_seq:
                continue
            s = base + o.offset_s
            if s < end and s + o.innet_s > start:
                yield seq, o


def _op(js: JobState, seq: int, o: OpTiming) -> Op:
    prof = js.profile
    remaining = math.inf
    if prof.steps_left is not None:
        done_steps = (seq - js.ref_seq) // len(prof.ops)
        remaining = max(prof.steps_left - done_steps, 0) * prof.step_s
    return Op(job=js.job, ring_s=o.ring_s, innet_s=o.innet_s, exposed=o.exposed, remaining_s=remaining, hosts=prof.hosts)
