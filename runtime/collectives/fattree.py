"""A k-ary fat tree, its jobs' aggregation trees, and host placement (for the collectives simulator).

k pods of k/2 edge and k/2 aggregation switches; k/2 hosts under each edge switch; (k/2)^2 core
switches, core c linked to aggregation switch c // (k/2) of every pod (k=16: 1024 hosts, 128 edge,
128 aggregation, 64 core switches). Switch ids: edges first, then aggregation switches pod by pod,
then cores. A job's aggregation tree spans its hosts up to a closest common ancestor: one edge switch
when its hosts share it; else its edge switches plus one of its pod's k/2 aggregation switches; else
its edge switches, one core, and that core's aggregation switch in each of its pods (MINA's trees).
A single-host job needs no tree.

Placement (which free hosts a job gets) and tree choice (which root) have two kinds each:

    placement  first-fit   the lowest-numbered free hosts (MINA's baseline)
               locality    the smallest subtree that fits (an edge switch, else a pod, else the cluster),
                           best fit, least contended; inside it, the children with the most free hosts
    tree       first-fit   the first root (for `exclusive`: the first whose switches are all free)
               least-load  the root whose tree carries the least load from the other jobs' trees
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvmsched.errors import TvmschedError

PLACEMENTS = ("first-fit", "locality")
TREES = ("first-fit", "least-load")


@dataclass(frozen=True)
class FatTree:
    """Topology arithmetic of a k-ary fat tree (k even, >= 2)."""

    k: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 2 or self.k % 2:
            raise TvmschedError(f"fat-tree degree k must be an even integer >= 2, got {self.k!r}")

    @property
    def half(self) -> int:
        return self.k // 2

    @property
    def hosts(self) -> int:
        return self.k**3 // 4

    @property
    def edges(self) -> int:
        return self.k * self.half

    @property
    def aggs(self) -> int:
        return self.k * self.half

    @property
    def cores(self) -> int:
        return self.half**2

    @property
    def switches(self) -> int:
        return self.edges + self.aggs + self.cores

    def edge_of(self, host: int) -> int:
        return host // self.half

    def pod_of(self, host: int) -> int:
        return host // (self.half * self.half)

    def agg(self, pod: int, index: int) -> int:
        return self.edges + pod * self.half + index

    def core(self, index: int) -> int:
        return self.edges + self.aggs + index

    def layer(self, switch: int) -> str:
        return "edge" if switch < self.edges else "agg" if switch < self.edges + self.aggs else "core"

    def trees(self, hosts: list[int]) -> list[tuple[int, ...]]:
        """Every aggregation tree of `hosts` (switch ids, root last), in first-fit order; [] for one host."""
        if len(hosts) <= 1:
            return []
        edges = sorted({self.edge_of(h) for h in hosts})
        if len(edges) == 1:
            return [tuple(edges)]
        pods = sorted({self.pod_of(h) for h in hosts})
        if len(pods) == 1:
            return [(*edges, self.agg(pods[0], a)) for a in range(self.half)]
        return [(*edges, *(self.agg(p, c // self.half) for p in pods), self.core(c)) for c in range(self.cores)]


@dataclass
class Hosts:
    """Which hosts are free, with per-edge and per-pod free counts (mutable placement state)."""

    tree: FatTree
    free: list[bool] = field(init=False)
    edge_free: list[int] = field(init=False)
    pod_free: list[int] = field(init=False)

    def __post_init__(self) -> None:
        t = self.tree
        self.free = [True] * t.hosts
        self.edge_free = [t.half] * t.edges
        self.pod_free = [t.half * t.half] * t.k

    @property
    def available(self) -> int:
        return sum(self.pod_free)

    def take(self, hosts: list[int]) -> None:
        self._mark(hosts, False, -1)

    def give(self, hosts: list[int]) -> None:
        self._mark(hosts, True, 1)

    def _mark(self, hosts: list[int], free: bool, delta: int) -> None:
        for h in hosts:
            self.free[h] = free
            self.edge_free[self.tree.edge_of(h)] += delta
            self.pod_free[self.tree.pod_of(h)] += delta


def place(kind: str, hosts: Hosts, n: int, load: list[float]) -> list[int] | None:
    """`n` free hosts chosen by `kind` (see the module docstring), or None when fewer are free."""
    if n > hosts.available:
        return None
    if kind == "first-fit":
        return [h for h, f in enumerate(hosts.free) if f][:n]
    return _place_locality(hosts, n, load)


def _place_locality(hosts: Hosts, n: int, load: list[float]) -> list[int]:
    t = hosts.tree
    fits = [e for e in range(t.edges) if hosts.edge_free[e] >= n]
    if fits:  # one edge switch: best fit, then the least contended
        e = min(fits, key=lambda e: (hosts.edge_free[e], load[e], e))
        return _take_from_edges(hosts, [e], n)
    pods = [p for p in range(t.k) if hosts.pod_free[p] >= n]
    if pods:
        p = min(pods, key=lambda p: (_edges_needed(hosts, range(p * t.half, (p + 1) * t.half), n),
                                     hosts.pod_free[p], p))
        return _take_from_edges(hosts, _fullest(hosts, range(p * t.half, (p + 1) * t.half), load), n)
    return _take_from_edges(hosts, _fullest(hosts, range(t.edges), load), n)


def _fullest(hosts: Hosts, edges, load: list[float]) -> list[int]:
    """Edges with free hosts, most free first (fewest switches in the tree), then least loaded."""
    return sorted((e for e in edges if hosts.edge_free[e]), key=lambda e: (-hosts.edge_free[e], load[e], e))


def _edges_needed(hosts: Hosts, edges, n: int) -> int:
    count = 0
    for free in sorted((hosts.edge_free[e] for e in edges), reverse=True):
        if n <= 0:
            break
        n -= free
        count += 1
    return count


def _take_from_edges(hosts: Hosts, edges: list[int], n: int) -> list[int]:
    half, out = hosts.tree.half, []
    for e in edges:
        out += [h for h in range(e * half, (e + 1) * half) if hosts.free[h]][: n - len(out)]
        if len(out) == n:
            break
    return out


def choose_tree(kind: str, candidates: list[tuple[int, ...]], load: list[float],
                held: list[int] | None = None) -> tuple[int, ...] | None:
    """One of `candidates` by `kind`; with `held` (exclusive use) only trees whose switches are all free."""
    if held is not None:
        candidates = [c for c in candidates if all(held[s] < 0 for s in c)]
    if not candidates:
        return None
    if kind == "first-fit":
        return candidates[0]
    return min(candidates, key=lambda c: sum(load[s] for s in c))


def check_kind(name: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise TvmschedError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")
