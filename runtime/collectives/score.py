"""CalcScore: which AllReduce gets a switch's in-network aggregation when several want it (mechanism E).

The decision (in `decision`, and replayed by `simulator`) asks for a score when an AllReduce is about
to start on a free switch and other jobs' AllReduces are expected while it would run; the highest
score gets the switch and the others run ring AllReduce. The score here:

    calc_score(op) = exposed * (ring_s - innet_s) / (wait_s + innet_s)

the seconds of the job's step time (hence of its JCT) that in-network aggregation saves, per second of
switch time it consumes (the wait until it can start is switch time lost to everyone else). Why:

- It is the benefit-density (weighted-shortest-processing-time) order for one resource: the switch is
  the scarce server, an AllReduce's "weight" is the JCT it saves, its "size" the switch time it takes.
  Ordering by weight / size minimises the lost saving when ops collide.
- `exposed` counts only the saving that shortens the step: DDP launches early buckets during backward,
  where a faster AllReduce changes nothing unless the collectives queue behind each other; the last
  bucket is exposed. An op whose saving is hidden scores 0 and yields to any op with a real saving.
- Unlike MINA (`mina_score`), the saving is not multiplied by the job's host count: the target is the
  average JCT, where every job counts once, so an 8-host job saving 4 ms is worth the same as a 2-host
  job saving 4 ms. Weighting by hosts (MINA optimises host-weighted JCT) hands the switch to wide jobs
  even when a narrow job saves more per second of switch time.
- Ties (equal density, e.g. two copies of one model) go to the job closer to completion, then to the
  smaller job id: shortest-remaining-time first finishes jobs sooner without costing the others, and
  a fixed winner lets the loser's phase drift away instead of colliding every step.

A MINA-style score (their INFOCOM 2025 scheduler, `mina_score`) is kept for comparison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Op:
    """An AllReduce that wants the switch: what the scores need to know of it."""

    job: str  # job id (ties: smaller id wins)
    ring_s: float  # duration as a ring AllReduce
    innet_s: float  # duration in-network (= how long it holds the switch)
    exposed: float = 1.0  # fraction of the saving (ring_s - innet_s) that shortens the job's step
    remaining_s: float = math.inf  # estimated remaining time of the job
    hosts: int = 2
    wait_s: float = 0.0  # from now until the op is ready to start (0 for the op deciding now)


def saving(op: Op) -> float:
    """Seconds of the job's step (and JCT) that running `op` in-network saves."""
    return max(0.0, op.exposed) * max(0.0, op.ring_s - op.innet_s)


def calc_score(op: Op) -> float:
    """JCT seconds saved per second of switch time consumed (see the module docstring)."""
    return saving(op) / max(op.wait_s + op.innet_s, 1e-12)


def mina_score(op: Op) -> float:
    """MINA's priority ratio: the step-time saving times the job's hosts, over the time until the op
    would finish in-network (src/sharing_policies/smart.cpp, Job::GetNextCommOpPriority)."""
    return saving(op) * op.hosts / max(op.wait_s + op.innet_s, 1e-12)


def order_key(op: Op, score=calc_score) -> tuple:
    """Sorts the op that should get the switch first: higher score, then shorter remaining time, then
    smaller job id. The real decision (decision.py) and the simulator both compare ops by it."""
    return (-score(op), op.remaining_s, _job_key(op.job))


def _job_key(job: str) -> tuple:
    """Job ids compare as numbers when both are numbers ("2" < "10"), else as text."""
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def ranked(ops: Iterable[Op], score=calc_score) -> list[Op]:
    """`ops` highest score first; ties: shorter remaining time, then smaller job id."""
    return sorted(ops, key=lambda op: order_key(op, score))
