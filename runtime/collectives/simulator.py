"""Simulate in-network aggregation shared among training jobs on a fat-tree cluster (mechanism E at scale).

    simulate(trace=1, policy="tdm")            # MINA's setting: one policy, 1000 jobs on a k=16 fat tree
    simulate_jobs([JobSpec(...), ...], "tdm")  # a few explicit jobs on one switch

MINA's setting (ClubieDong/MinaSimulator, INFOCOM 2025), reproduced in our own code: a k=16 fat tree;
1000 jobs, each a model drawn uniformly from OPT-125M/350M/1.3B, BERT-base/large, ViT-base/large at
batch size 4 (`workloads`), 10-100 steps, a host count drawn from one of ten production traces; links
of 100 Gb/s; an AllReduce takes 50 us + size / bandwidth, in-network 50 us + size / (2 x bandwidth),
one host 50 us. Arrivals as theirs: every job is queued at time 0 and jobs start in queue order as
soon as enough hosts are free (no backfilling). A job's JCT runs from its start to its end (their
JCT, which leaves out the queueing). JCTScore = (avgJCT_none - avgJCT) / (avgJCT_none - avgJCT_ideal),
where `none` runs every AllReduce as ring and `ideal` gives every job in-network aggregation to
itself; both follow in closed form from the same jobs (a job's JCT depends only on its own steps
there), so each `simulate` reports them.

Policies (`engine`): tdm (mechanism E with score.calc_score), mina (the same decision with MINA's
score), greedy (in-network whenever the tree is free), exclusive (SHARP's default), spatial (ATP-style
bandwidth sharing), none, ideal. Placement and tree choice (`fattree`): first-fit (MINA's baseline) or
ours, locality and least-load (the defaults).

Traces are numbered 1-10 as in MINA's figures (their trace i is our i + 1); MINA's published
0.253 (greedy sharing, first-fit hosts and trees) and 0.928 (all their policies) are on trace 1.

`setting="comm-heavy"`: links of 25 Gb/s, the four larger models (OPT-350M, OPT-1.3B, BERT-large,
ViT-large), twice the trace's host counts: in-network aggregation saves 40-45% of each step (vs 4% of
OPT-125M's alone at 100 Gb/s), and wide jobs share switches.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tvmsched.errors import TvmschedError
from tvmsched.runtime.collectives import fattree, workloads
from tvmsched.runtime.collectives.engine import POLICIES, Engine, Run, Timing, timing
from tvmsched.runtime.collectives.workloads import Gpu, Profile

TRACES_ENV = "TVMSCHED_HOST_TRACES"
DEFAULT_TRACES = Path(__file__).resolve().parent / "data" / "host_count_traces.json"  # MINA's traces, bundled


@dataclass(frozen=True)
class Setting:
    """A cluster workload preset."""

    link_gbps: float = 100.0
    models: tuple[str, ...] = workloads.MODELS
    host_scale: int = 1  # multiplies every host count drawn from the trace
    gpu: Gpu = field(default_factory=Gpu)
    latency_s: float = workloads.LATENCY_S
    innet_speedup: float = 2.0  # SHARP: in-network AllReduce moves half the bytes of a ring's
    k: int = 16


SETTINGS = {
    "mina": Setting(),
    "comm-heavy": Setting(link_gbps=25.0, models=("opt-350m", "opt-1.3b", "bert-large", "vit-large"), host_scale=2),
}
BEST_PLACEMENT, BEST_TREE = "locality", "least-load"


def host_traces(path: str | os.PathLike | None = None) -> list[list[list[int]]]:
    """The ten host-count traces ([host_count, weight] pairs), from `path`, $TVMSCHED_HOST_TRACES or
    the copy bundled with the package (data/README.md)."""
    path = Path(path or os.environ.get(TRACES_ENV) or DEFAULT_TRACES)
    try:
        traces = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise TvmschedError(f"cannot read host-count traces from {path}: {err}") from None
    if not isinstance(traces, list) or not traces or not all(_is_trace(t) for t in traces):
        raise TvmschedError(f"{path} is not a list of host-count traces (each a non-empty list of [hosts >= 1, weight > 0] pairs)")
    return traces


def _is_trace(trace) -> bool:
    def number(x, low):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= low and math.isfinite(x)
    return isinstance(trace, list) and bool(trace) and all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and number(p[0], 1) and number(p[1], 0) and p[1] > 0
        for p in trace)


def job_timing(profile: Profile, hosts: int, setting: Setting) -> Timing:
    bw = setting.link_gbps * 1e9 / 8
    ring = [workloads.transfer_s(s, hosts, bw, setting.latency_s) for s in profile.sizes]
    innet = [workloads.transfer_s(s, hosts, bw, setting.latency_s, setting.innet_speedup) for s in profile.sizes]
    return timing(profile, ring, innet)


class _Cluster:
    """FIFO admission onto the fat tree: placement, tree choice, and the load they balance."""

    def __init__(self, engine: Engine, setting: Setting, placement: str, tree: str):
        self.engine, self.placement, self.tree_kind = engine, placement, tree
        self.topo = fattree.FatTree(setting.k)
        self.hosts = fattree.Hosts(self.topo)
        self.load = [0.0] * self.topo.switches
        self.queue: deque[Run] = deque()
        self.done: list[Run] = []
        self.progress: Callable[[int, int], None] | None = None
        self.total = 0

    def admit(self, now: float) -> None:
        while self.queue:
            r = self.queue[0]
            placed = fattree.place(self.placement, self.hosts, r.hosts, self.load)
            if placed is None:
                return
            self.queue.popleft()
            self.hosts.take(placed)
            r.placed = placed
            self.engine.start(r, now, self._tree(r, placed))
            for s in r.tree:
                self.load[s] += _weight(r)

    def _tree(self, r: Run, placed: list[int]) -> tuple[int, ...]:
        candidates = self.topo.trees(placed)
        if self.engine.policy in ("none", "ideal") or not candidates:
            return ()
        if self.engine.policy == "exclusive":
            tree = fattree.choose_tree(self.tree_kind, candidates, self.load, self.engine.holder)
            r.holds = tree is not None
            return tree or ()
        return fattree.choose_tree(self.tree_kind, candidates, self.load)

    def finished(self, r: Run, now: float) -> None:
        self.hosts.give(r.placed)
        for s in r.tree:
            self.load[s] -= _weight(r)
        self.done.append(r)
        if self.progress is not None:
            self.progress(len(self.done), self.total)
        self.admit(now)


def _weight(r: Run) -> float:
    """A job's contention weight on its switches: the share of its step that in-network saves, plus a
    little so that hidden-communication jobs still spread out."""
    return r.tm.exposure + 0.01


def _check(trace: int, policy: str, jobs: int, setting: str, placement: str, tree: str, n_traces: int) -> None:
    fattree.check_kind("policy", policy, POLICIES)
    fattree.check_kind("setting", setting, tuple(SETTINGS))
    fattree.check_kind("placement", placement, fattree.PLACEMENTS)
    fattree.check_kind("tree choice", tree, fattree.TREES)
    if not isinstance(trace, int) or isinstance(trace, bool) or not 1 <= trace <= n_traces:
        raise TvmschedError(f"trace must be an integer in 1..{n_traces} (MINA's numbering), got {trace!r}")
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise TvmschedError(f"jobs must be a positive integer, got {jobs!r}")


def simulate(trace: int, policy: str, jobs: int = 1000, link_gbps: float | None = None, seed: int = 0,
             placement: str = BEST_PLACEMENT, tree: str = BEST_TREE, setting: str = "mina",
             progress: Callable[[int, int], None] | None = None, traces_path: str | None = None) -> dict:
    """Run `jobs` jobs of host-count trace `trace` (1-10) under `policy` on the setting's fat tree.

    `link_gbps` overrides the setting's link rate (100 Gb/s for "mina", 25 for "comm-heavy").
    `progress(done, total)` is called as jobs finish. Returns avg_jct_s and jct_score with the
    closed-form none/ideal averages of the same jobs, innet_fraction (AllReduce bytes of multi-host
    jobs aggregated in the network), makespan_s, and the inputs.
    """
    all_traces = host_traces(traces_path)
    _check(trace, policy, jobs, setting, placement, tree, len(all_traces))
    preset = SETTINGS[setting]
    if link_gbps is not None:
        workloads.check_positive("link_gbps", link_gbps)
        preset = dataclasses.replace(preset, link_gbps=float(link_gbps))
    draws = workloads.draw_jobs(all_traces[trace - 1], jobs, seed, models=preset.models,
                                host_scale=preset.host_scale)
    if max(d.hosts for d in draws) > fattree.FatTree(preset.k).hosts:
        raise TvmschedError(f"trace {trace} has jobs wider than the {fattree.FatTree(preset.k).hosts}-host cluster")
    runs = _runs(draws, preset)
    engine = Engine(policy, fattree.FatTree(preset.k).switches)
    cluster = _Cluster(engine, preset, placement, tree)
    engine.on_finish = cluster.finished
    cluster.queue.extend(runs)
    cluster.progress, cluster.total = progress, len(runs)
    cluster.admit(0.0)
    engine.run()
    return {"policy": policy, "trace": trace, "jobs": jobs, "setting": setting, "placement": placement,
            "tree": tree, "link_gbps": preset.link_gbps, "seed": seed, **summarize(cluster.done)}


def _runs(draws: list[workloads.JobDraw], setting: Setting) -> list[Run]:
    cache: dict[tuple[str, int], Timing] = {}
    out = []
    for i, d in enumerate(draws):
        key = (d.model, d.hosts)
        if key not in cache:
            cache[key] = job_timing(workloads.profile(d.model, setting.gpu), d.hosts, setting)
        out.append(Run(i, d.model, cache[key], d.hosts, d.steps))
    return out


def summarize(runs: list[Run]) -> dict:
    """Average JCT, its closed-form none/ideal counterparts and JCTScore, in-network byte share."""
    n = len(runs)
    avg = sum(r.end - r.start for r in runs) / n
    none = sum(r.steps * r.tm.step_ring for r in runs) / n
    ideal = sum(r.steps * r.tm.step_innet for r in runs) / n
    innet = sum(r.innet_bytes for r in runs)
    total = innet + sum(r.ring_bytes for r in runs)
    return {"avg_jct_s": avg, "jct_score": (none - avg) / (none - ideal) if none > ideal else math.nan,
            "avg_jct_none_s": none, "avg_jct_ideal_s": ideal, "innet_fraction": innet / total if total else 0.0,
            "makespan_s": max(r.end for r in runs)}


@dataclass(frozen=True)
class JobSpec:
    """One job of a small explicit case on a single switch.

    Each step computes for `compute_s`; bucket i's AllReduce is launched at `starts_s[i]` after the
    step's start (DDP overlap with backward), or at `compute_s` when `starts_s` is None (compute, then
    the buckets in order). One collective is in flight per job at a time; the step ends at
    max(compute_s, last AllReduce end).
    """

    name: str
    steps: int
    bucket_bytes: tuple[int, ...]
    compute_s: float
    starts_s: tuple[float, ...] | None = None
    hosts: int = 2
    arrival_s: float = 0.0

    def profile(self) -> Profile:
        starts = self.starts_s if self.starts_s is not None else (self.compute_s,) * len(self.bucket_bytes)
        return Profile(self.name, 0, tuple(self.bucket_bytes), tuple(starts), self.compute_s)


def _check_spec(spec: JobSpec) -> None:
    if not isinstance(spec.steps, int) or spec.steps < 1:
        raise TvmschedError(f"job {spec.name!r}: steps must be a positive integer, got {spec.steps!r}")
    if not spec.bucket_bytes or any(not isinstance(b, int) or b < 0 for b in spec.bucket_bytes):
        raise TvmschedError(f"job {spec.name!r}: bucket_bytes must be a non-empty list of byte counts")
    if spec.starts_s is not None and len(spec.starts_s) != len(spec.bucket_bytes):
        raise TvmschedError(f"job {spec.name!r}: starts_s needs one time per bucket")
    if spec.compute_s < 0 or spec.arrival_s < 0 or spec.hosts < 1:
        raise TvmschedError(f"job {spec.name!r}: compute_s and arrival_s must be >= 0 and hosts >= 1")


def simulate_jobs(jobs: list[JobSpec], policy: str, *, link_gbps: float = 100.0, latency_s: float = workloads.LATENCY_S,
                  innet_speedup: float = 2.0, ring_s: Callable[[int], float] | None = None,
                  innet_s: Callable[[int], float] | None = None) -> dict:
    """Run `jobs` on one switch that aggregates one job at a time; per-job JCT (arrival to end).

    AllReduce durations follow MINA's formula at `link_gbps` (`latency_s` + size / bandwidth, in-network
    `innet_speedup` times faster, one host only the latency) unless `ring_s(size)` / `innet_s(size)` are
    given (e.g. fitted to measured collectives). Under `exclusive` the first job to arrive holds the switch.
    """
    fattree.check_kind("policy", policy, POLICIES)
    if len({j.name for j in jobs}) != len(jobs) or not jobs:
        raise TvmschedError("simulate_jobs needs at least one job and distinct job names")
    for spec in jobs:
        _check_spec(spec)
    workloads.check_positive("link_gbps", link_gbps)
    setting = Setting(link_gbps=link_gbps, latency_s=latency_s, innet_speedup=innet_speedup)
    engine = Engine(policy, 1)
    runs = []
    for i, spec in enumerate(sorted(jobs, key=lambda j: j.arrival_s)):
        tm = job_timing(spec.profile(), spec.hosts, setting)
        if ring_s is not None or innet_s is not None:
            ring = [ring_s(s) if ring_s else d for s, d in zip(spec.bucket_bytes, tm.ring)]
            innet = [innet_s(s) if innet_s else d for s, d in zip(spec.bucket_bytes, tm.innet)]
            tm = timing(spec.profile(), ring, innet)
        runs.append(Run(i, spec.name, tm, spec.hosts, spec.steps, spec.arrival_s))
        engine.arrive_at(runs[-1])

    def arrive(r: Run, t: float) -> None:
        tree = (0,) if r.hosts > 1 and policy not in ("none", "ideal") else ()
        if policy == "exclusive" and tree:
            r.holds = engine.holder[0] < 0
            tree = tree if r.holds else ()
        engine.start(r, t, tree)

    engine.run(on_arrive=arrive)
    jct = {r.name: r.end - r.arrival for r in runs}
    return {"policy": policy, "jct_s": jct, "avg_jct_s": sum(jct.values()) / len(jct),
            "innet_ops": {r.name: r.innet_ops for r in runs},
            "innet_fraction": _fraction(runs)}


def _fraction(runs: list[Run]) -> float:
    innet = sum(r.innet_bytes for r in runs)
    total = innet + sum(r.ring_bytes for r in runs)
    return innet / total if total else 0.0
