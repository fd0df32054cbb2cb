"""Memory tiering (mechanism D), the planner: where each GPU's memory beyond its own goes.

A policy: pure Python, it touches no device. Every task is split into one sub-task per GPU (consecutive
layer groups), the sub-tasks are placed on the GPUs (forward, or serpentine when tasks outnumber GPUs),
and each GPU's extra memory (its sub-tasks' bytes beyond its own memory) is taken from the tiers in
priority order, DRAM, CXL (a CPU-less NUMA node), disk, within the GPU's share of each. docs/tiering.md
has the rules and the choices the method leaves open.

    topology = Topology.load("server.json")          # or Topology.discover()
    tasks = [TierTask.from_artifact(p, len(topology.gpus)) for p in paths]
    plan = plan_memory(topology, tasks)
    plan.gpu(0).tiers                                # [(tier index, bytes), ...] in topology.tiers
"""

from __future__ import annotations

import json
import logging
import numbers
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path

from tvmsched.errors import TvmschedError, one_line

log = logging.getLogger(__name__)

KINDS = ("dram", "cxl", "disk")  # the tiers' priority order
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*")


def parse_bytes(text: str | int) -> int:
    """Bytes from `1048576`, `512MiB`, `2GiB` or `1.5GB` (units: B, KB..TB decimal, KiB..TiB binary;
    case-insensitive; a fraction of a byte is dropped)."""
    if isinstance(text, int) and not isinstance(text, bool) and text >= 0:
        return text
    match = _SIZE.fullmatch(str(text))
    if not match or match[2].lower() not in _UNITS:
        raise TvmschedError(f"bad size {text!r}: expected bytes, or a number with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    try:
        return int(Decimal(match[1]) * _UNITS[match[2].lower()])
    except InvalidOperation:
        raise TvmschedError(f"bad size {text!r}") from None


@dataclass(frozen=True)
class Gpu:
    id: int
    memory_bytes: int


@dataclass(frozen=True)
class Tier:
    """A target memory: kind "dram", "cxl" (numa_node: the CPU-less node) or "disk" (path: a folder)."""

    kind: str
    capacity_bytes: int
    numa_node: int | None = None
    path: str | None = None


@dataclass(frozen=True)
class Topology:
    """The GPUs (their list order numbers them) and the tiers (several of a kind are pooled)."""

    gpus: tuple[Gpu, ...]
    tiers: tuple[Tier, ...] = ()

    @classmethod
    def from_json(cls, data: dict, source: str = "topology") -> Topology:
        """Check and read the JSON form; a bad field is one TvmschedError naming it (and `source`)."""
        return _parse_topology(data, source)

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        try:
            data = json.loads(Path(path).read_text())
        except OSError as err:
            raise TvmschedError(f"cannot read the topology {path}: {err.strerror or err}") from None
        except ValueError as err:
            raise TvmschedError(f"the topology {path} is not valid JSON ({err})") from None
        return cls.from_json(data, str(path))

    @classmethod
    def discover(cls, disk_dir: str | Path | None = None, sysfs: str | Path = "/sys/devices/system/node",
                 meminfo: str | Path = "/proc/meminfo") -> Topology:
        """This machine: NVML's GPUs (none: the CPU engine's arena as device 0, MemAvailable bytes), DRAM
        (free memory of the NUMA nodes with CPUs), one CXL tier per node with memory and no CPUs, and
        the free space of `disk_dir` (default: the temp folder)."""
        gpus = _nvml_gpus() or (Gpu(0, _meminfo_field(Path(meminfo), "MemAvailable")),)
        dram, cxl = _numa_tiers(Path(sysfs))
        if dram is None:
            dram = _meminfo_field(Path(meminfo), "MemAvailable")
        disk = Path(disk_dir or tempfile.gettempdir())
        if not disk.is_dir():
            raise TvmschedError(f"the disk directory {disk} does not exist")
        tiers = (Tier("dram", dram), *cxl, Tier("disk", shutil.disk_usage(disk).free, path=str(disk)))
        log.info("discovered %d GPUs and tiers %s", len(gpus), tiers)
        return cls(gpus, tiers)

    def to_json(self) -> dict:
        tiers = [{k: v for k, v in vars(t).items() if v is not None} for t in self.tiers]
        return {"gpus": [vars(g).copy() for g in self.gpus], "tiers": tiers}


@dataclass(frozen=True)
class TierTask:
    """A task as the planner sees it: the bytes of each sub-task (layer_ranges: their layers [start, stop))."""

    name: str
    subtask_bytes: tuple[int, ...]
    layer_ranges: tuple[tuple[int, int], ...] = ()

    def __post_init__(self):
        if any(not isinstance(b, numbers.Integral) or b < 0 for b in self.subtask_bytes):
            raise TvmschedError(f"task {self.name}: sub-task bytes must be non-negative integers")
        object.__setattr__(self, "subtask_bytes", tuple(int(b) for b in self.subtask_bytes))
        object.__setattr__(self, "layer_ranges", tuple(tuple(r) for r in self.layer_ranges))

    @property
    def need(self) -> int:
        return sum(self.subtask_bytes)

    @classmethod
    def from_bytes(cls, name: str, nbytes: int, parts: int) -> TierTask:
        """`nbytes` split evenly into `parts` sub-tasks, the remainder to the first ones."""
        if not isinstance(nbytes, int) or nbytes < 0:
            raise TvmschedError(f"task {name}: bytes must be a non-negative integer, not {nbytes!r}")
        base, extra = divmod(nbytes, _check_parts(parts, name))
        return cls(name, tuple(base + (j < extra) for j in range(parts)))

    @classmethod
    def from_artifact(cls, path: str | Path, parts: int) -> TierTask:
        """An artifact (named by its file stem) split into `parts` groups of consecutive layers that
        balance bytes: a layer's bytes are the weights it reads first plus its outputs."""
        from tvmsched.artifact.format import Manifest

        sizes = layer_bytes(Manifest.verified(path))
        ranges = split_layers(sizes, _check_parts(parts, str(path)))
        return cls(Path(path).stem, tuple(sum(sizes[a:b]) for a, b in ranges), ranges)


def _check_parts(parts: int, name: str) -> int:
    if not isinstance(parts, int) or parts < 1:
        raise TvmschedError(f"task {name}: needs at least one sub-task, not {parts!r}")
    return parts


def layer_bytes(manifest) -> list[int]:
    """Per layer: the weights it is the first to read plus its output tensors."""
    seen: set[str] = set()
    sizes = []
    for layer in manifest.layers:
        weights = [t for t in dict.fromkeys(layer.inputs) if manifest.tensors[t].kind == "weight" and t not in seen]
        seen.update(weights)
        sizes.append(sum(manifest.tensors[t].nbytes for t in (*weights, *layer.outputs)))
    return sizes


def split_layers(sizes: list[int], parts: int) -> tuple[tuple[int, int], ...]:
    """`parts` consecutive [start, stop) groups: group i ends where the running sum is closest to
    total*(i+1)/parts, each group at least one layer; fewer layers than parts: one layer each, then empty."""
    count = len(sizes)
    if count <= parts:
        return tuple((min(i, count), min(i + 1, count)) for i in range(parts))
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    ranges, start = [], 0
    for i in range(parts - 1):
        target = prefix[-1] * (i + 1) / parts
        stop = min(range(start + 1, count - (parts - 2 - i)), key=lambda end: abs(prefix[end] - target))
        ranges.append((start, stop))
        start = stop
    return (*ranges, (start, count))


@dataclass(frozen=True)
class Placement:
    task: str
    subtask: int
    gpu: int  # the GPU's id
    bytes: int


@dataclass(frozen=True)
class GpuPlan:
    """One GPU's part of a plan; `tiers` splits its uses per tier: (index in topology.tiers, bytes)."""

    id: int
    memory_bytes: int
    load_bytes: int  # its sub-tasks' bytes
    extra_bytes: int  # load - memory (negative: room to spare)
    shares: dict[str, int]
    uses: dict[str, int]
    tiers: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Plan:
    order: str  # "forward" | "reverse"
    placements: tuple[Placement, ...]
    gpus: tuple[GpuPlan, ...]
    topology: Topology = field(repr=False)

    def gpu(self, gpu_id: int) -> GpuPlan:
        for entry in self.gpus:
            if entry.id == gpu_id:
                return entry
        raise TvmschedError(f"the plan has no GPU {gpu_id}")

    def to_json(self) -> dict:
        return {"order": self.order, "placements": [vars(p).copy() for p in self.placements],
                "gpus": [{"id": g.id, "extra_bytes": g.extra_bytes, "shares": dict(g.shares), "uses": dict(g.uses)}
                         for g in self.gpus]}


def gpu_position(k: int, j: int, n_tasks: int, n_gpus: int) -> int:
    """Position in the GPU list of sub-task j of the k-th task (largest first). Forward: (k + j) mod N.
    Reverse (more tasks than GPUs): serpentine, each round of N tasks walks the list the other way."""
    round_, p = divmod(k, n_gpus)
    if n_tasks <= n_gpus or round_ % 2 == 0:
        return (p + j) % n_gpus
    return (n_gpus - 1 - p - j) % n_gpus


def plan_memory(topology: Topology, tasks: list[TierTask]) -> Plan:
    """Place every task's sub-tasks and cover each GPU's extra memory from DRAM, CXL, then disk; a GPU
    whose extra its shares cannot cover is a TvmschedError naming it and the bytes missing."""
    n = len(topology.gpus)
    if not n:
        raise TvmschedError("the topology has no GPUs")
    names = [t.name for t in tasks]
    for task in tasks:
        if names.count(task.name) > 1:
            raise TvmschedError(f"two tasks are named {task.name}")
        if len(task.subtask_bytes) != n:
            raise TvmschedError(f"task {task.name} has {len(task.subtask_bytes)} sub-tasks for {n} GPU(s)")
    ordered = sorted(tasks, key=lambda t: (-t.need, t.name))
    placements = tuple(Placement(t.name, j, topology.gpus[gpu_position(k, j, len(ordered), n)].id, b)
                       for k, t in enumerate(ordered) for j, b in enumerate(t.subtask_bytes))
    remaining = [t.capacity_bytes for t in topology.tiers]
    gpus, short = [], []
    for i, gpu in enumerate(topology.gpus):
        load = sum(p.bytes for p in placements if p.gpu == gpu.id)
        entry, missing = _cover(gpu, load, topology.tiers, remaining, n - i)
        gpus.append(entry)
        if missing:
            short.append(f"GPU {gpu.id} lacks {missing} bytes ({human_bytes(missing)}): {entry.extra_bytes} bytes beyond "
                         f"its memory, {entry.extra_bytes - missing} within its shares")
    if short:
        raise TvmschedError("not enough memory in DRAM, CXL and disk shares: " + "; ".join(short))
    return Plan("forward" if len(ordered) <= n else "reverse", placements, tuple(gpus), topology)


def fill_kind(tiers: tuple[Tier, ...], remaining: list[int], kind: str, nbytes: int) -> list[tuple[int, int]]:
    """Take `nbytes` of a kind from its tiers in topology order: [(tier index, bytes)]; `remaining` is
    updated. What the tiers cannot hold is left out (the caller checks the sum)."""
    split = []
    for i, tier in enumerate(tiers):
        amount = min(nbytes, remaining[i]) if tier.kind == kind else 0
        if amount:
            split.append((i, amount))
            remaining[i] -= amount
            nbytes -= amount
    return split


def _cover(gpu: Gpu, load: int, tiers: tuple[Tier, ...], remaining: list[int], unassigned: int) -> tuple[GpuPlan, int]:
    """One GPU's shares (remaining capacity of a kind / GPUs not yet assigned) and what it takes of
    them, in priority order, only what it needs; `remaining` is updated. Returns the entry and the
    bytes left uncovered."""
    rest = max(load - gpu.memory_bytes, 0)
    shares, uses, split = {}, {}, []
    for kind in KINDS:
        indices = [i for i, tier in enumerate(tiers) if tier.kind == kind]
        shares[kind] = sum(remaining[i] for i in indices) // unassigned
        uses[kind] = take = min(rest, shares[kind])
        rest -= take
        split += fill_kind(tiers, remaining, kind, take)
    return GpuPlan(gpu.id, gpu.memory_bytes, load, load - gpu.memory_bytes, shares, uses, tuple(split)), rest


def format_plan(plan: Plan) -> str:
    """A readable table: sub-tasks per GPU, then each GPU's extra and its use of each tier's share."""
    lines = [f"order {plan.order}: {len({p.task for p in plan.placements})} tasks on {len(plan.gpus)} GPU(s)", ""]
    for g in plan.gpus:
        subtasks = ", ".join(f"{p.task}#{p.subtask} {human_bytes(p.bytes)}" for p in plan.placements if p.gpu == g.id)
        lines.append(f"GPU {g.id}: {subtasks or 'nothing'}")
    lines += ["", f"{'GPU':>4} {'memory':>10} {'load':>10} {'extra':>10}" + "".join(f" {k + ' use/share':>23}" for k in KINDS)]
    for g in plan.gpus:
        cells = "".join(f" {human_bytes(g.uses[k]) + ' / ' + human_bytes(g.shares[k]):>23}" for k in KINDS)
        sizes = "".join(f" {human_bytes(b):>10}" for b in (g.memory_bytes, g.load_bytes, g.extra_bytes))
        lines.append(f"{g.id:>4}{sizes}{cells}")
    lines.append("")
    for i, tier in enumerate(plan.topology.tiers):
        used = sum(b for g in plan.gpus for t, b in g.tiers if t == i)
        where = f" node {tier.numa_node}" if tier.numa_node is not None else f" {tier.path}" if tier.path else ""
        lines.append(f"tier {i} {tier.kind}{where}: {human_bytes(used)} used of {human_bytes(tier.capacity_bytes)}")
    return "\n".join(lines)


def human_bytes(n: int) -> str:
    """`n` bytes in binary units, three significant digits (`512 B`, `1.50 GiB`)."""
    size, unit = abs(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{'-' if n < 0 else ''}{size:.3g} {unit}" if unit != "B" else f"{n} B"


# ---- reading a topology and discovering this machine's -----------------------------------------

def _parse_topology(data, source: str) -> Topology:
    def fail(message: str):
        raise TvmschedError(f"{source}: {message}")

    def nonneg(entry: dict, key: str, where: str) -> int:
        value = entry.get(key)
        if key not in entry:
            fail(f"{where} has no {key}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            fail(f"{where}.{key} must be a non-negative integer, not {value!r}")
        return value

    def only(entry, keys: set[str], where: str) -> dict:
        if not isinstance(entry, dict):
            fail(f"{where} must be an object, not {entry!r}")
        for key in entry:
            if key not in keys:
                fail(f"{where} has an unknown field {key!r} (known: {', '.join(sorted(keys))})")
        return entry

    only(data, {"gpus", "tiers"}, "the topology")
    if "gpus" not in data:
        fail("missing 'gpus'")
    if not isinstance(data["gpus"], list) or not data["gpus"]:
        fail(f"'gpus' must be a non-empty list, not {data['gpus']!r}")
    gpus = []
    for i, entry in enumerate(data["gpus"]):
        only(entry, {"id", "memory_bytes"}, f"gpus[{i}]")
        gpu = Gpu(nonneg(entry, "id", f"gpus[{i}]"), nonneg(entry, "memory_bytes", f"gpus[{i}]"))
        if any(g.id == gpu.id for g in gpus):
            fail(f"gpus[{i}]: duplicate GPU id {gpu.id}")
        gpus.append(gpu)
    if not isinstance(data.get("tiers", []), list):
        fail(f"'tiers' must be a list, not {data['tiers']!r}")
    tiers = []
    for i, entry in enumerate(data.get("tiers", [])):
        where = f"tiers[{i}]"
        only(entry, {"kind", "capacity_bytes", "numa_node", "path"}, where)
        if entry.get("kind") not in KINDS:
            fail(f"{where}.kind must be one of {', '.join(KINDS)}, not {entry.get('kind')!r}")
        node = nonneg(entry, "numa_node", where) if "numa_node" in entry or entry["kind"] == "cxl" else None
        if node is not None and any(t.numa_node == node for t in tiers):
            fail(f"{where}: NUMA node {node} appears twice")
        path = entry.get("path")
        if entry["kind"] == "disk" and (not isinstance(path, str) or not path):
            fail(f"{where} (disk) needs a path, a folder")
        tiers.append(Tier(entry["kind"], nonneg(entry, "capacity_bytes", where), node, path))
    return Topology(tuple(gpus), tuple(tiers))


def _nvml_gpus() -> tuple[Gpu, ...]:
    """NVML's GPUs (id: NVML index, memory: free bytes now); none without nvidia-ml-py or a driver."""
    try:
        import pynvml
    except ImportError:
        return ()
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        log.info("no NVML (%s): no GPUs", err)
        return ()
    try:
        return tuple(Gpu(i, int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(i)).free))
                     for i in range(pynvml.nvmlDeviceGetCount()))
    except pynvml.NVMLError as err:
        raise TvmschedError(f"NVML cannot list the GPUs ({err}): use a topology file") from None
    finally:
        pynvml.nvmlShutdown()


def _numa_tiers(root: Path) -> tuple[int | None, list[Tier]]:
    """DRAM bytes (MemFree of the nodes with CPUs; None without sysfs) and a CXL tier per CPU-less node."""
    nodes = sorted((p for p in root.glob("node*") if p.name[4:].isdigit()), key=lambda p: int(p.name[4:]))
    if not nodes:
        return None, []
    dram, cxl = 0, []
    for node in nodes:
        cpus = (node / "cpulist").read_text().strip() if (node / "cpulist").exists() else ""
        free = _meminfo_field(node / "meminfo", "MemFree")
        if cpus:
            dram += free
        elif _meminfo_field(node / "meminfo", "MemTotal") > 0:
            cxl.append(Tier("cxl", free, numa_node=int(node.name[4:])))
    return dram, cxl


def _meminfo_field(path: Path, key: str) -> int:
    """A field of /proc/meminfo (`MemAvailable: N kB`) or a node's meminfo (`Node 0 MemFree: N kB`), in bytes."""
    try:
        for line in path.read_text().splitlines():
            words = line.split()
            if f"{key}:" in words:
                return int(words[words.index(f"{key}:") + 1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


# ---- executing a plan: this runtime's shares of the tiers (the engine streams: runtime/native/src/tiering.cc) ----

_PRIORITY = {"dram": 0, "cxl": 1, "disk": 2}


@dataclass(frozen=True)
class TierSettings:
    """Where a Runtime keeps the weights of models larger than its memory budget (docs/tiering.md).

    Args:
        topology: "auto" (discovered), a topology JSON file, its dict, or a Topology.
        plan: a plan for that topology (`tvmsched plan-memory --json`: a file, its dict, or a Plan):
            this runtime takes GPU `gpu`'s uses as its shares of the tiers. None: this device is the
            topology's only GPU, whose shares are the tiers' whole capacities.
        gpu: the plan's GPU this runtime serves.
        buffer_bytes: each of the two stream buffers on the device (0: the engine's default, the largest
            layer's weights or 1/8 of the device memory left, the larger).
        disk_dir: the disk tier's folder for "auto" (default: the temporary folder).
    """

    topology: str | Path | dict | Topology = "auto"
    plan: str | Path | dict | Plan | None = None
    gpu: int = 0
    buffer_bytes: int = 0
    disk_dir: str | Path | None = None

    def resolve_topology(self) -> Topology:
        if isinstance(self.topology, Topology):
            return self.topology
        if isinstance(self.topology, dict):
            return Topology.from_json(self.topology)
        if str(self.topology) == "auto":
            return Topology.discover(self.disk_dir)
        return Topology.load(self.topology)

    def shares(self) -> list[tuple[Tier, int]]:
        """This runtime's share of each tier, in priority order (DRAM, CXL, disk; topology order within a kind)."""
        topology = self.resolve_topology()
        if self.plan is None:
            shares = [(tier, tier.capacity_bytes) for tier in topology.tiers]
        else:
            shares = _plan_shares(self.plan, self.gpu, topology)
        return sorted(shares, key=lambda item: _PRIORITY[item[0].kind])


def device_shares(settings: TierSettings, gpu: int) -> list[tuple[Tier, int]]:
    """GPU `gpu`'s shares of the tiers when one Runtime serves every GPU of `settings`' plan (docs/multi-device.md):
    on each tier, its planned use plus an even part of what no GPU's planned use takes. The shares add up to each
    tier's capacity, none is below its GPU's use, and so no GPU's streaming can starve another's. The slack is for the
    engine, which streams more than the planner's extra (a part's bytes beyond the GPU's memory): it keeps two stream
    buffers on the device and page-rounds each streamed weight."""
    topology = settings.resolve_topology()
    if settings.plan is None:
        return settings.shares()
    used = [0] * len(topology.tiers)
    mine = [0] * len(topology.tiers)
    for each in topology.gpus:
        for tier, nbytes in _plan_shares(settings.plan, each.id, topology):
            index = next(i for i, t in enumerate(topology.tiers) if t is tier)
            used[index] += nbytes
            if each.id == gpu:
                mine[index] += nbytes
    if all(each.id != gpu for each in topology.gpus):
        raise TvmschedError(f"the plan has no GPU {gpu}")
    n = len(topology.gpus)
    shares = [(tier, mine[i] + (tier.capacity_bytes - used[i]) // n) for i, tier in enumerate(topology.tiers)]
    return sorted(shares, key=lambda item: _PRIORITY[item[0].kind])


def _plan_shares(plan, gpu: int, topology: Topology) -> list[tuple[Tier, int]]:
    if isinstance(plan, Plan):
        entry = plan.gpu(gpu)
        return [(topology.tiers[index], nbytes) for index, nbytes in entry.tiers]
    if not isinstance(plan, dict):
        try:
            plan = json.loads(Path(plan).read_text())
        except (OSError, ValueError) as err:
            raise TvmschedError(f"cannot read the plan {plan}: {one_line(err)}") from None
    gpus = plan.get("gpus") if isinstance(plan, dict) else None
    if not isinstance(gpus, list) or not any(isinstance(g, dict) and g.get("id") == gpu for g in gpus):
        raise TvmschedError(f"the plan has no GPU {gpu}")
    remaining = [t.capacity_bytes for t in topology.tiers]
    for entry in gpus:  # replay the GPUs' uses in plan order: a kind's use fills its tiers' remaining capacity in topology order
        uses = entry.get("uses") if isinstance(entry, dict) else None
        if not isinstance(uses, dict) or any(k not in _PRIORITY or not isinstance(v, int) or v < 0 for k, v in uses.items()):
            raise TvmschedError(f"the plan's GPU {entry.get('id') if isinstance(entry, dict) else entry} has no valid uses (kind -> bytes)")
        shares = []
        for kind, want in uses.items():
            split = fill_kind(topology.tiers, remaining, kind, want)
            shares += [(topology.tiers[index], nbytes) for index, nbytes in split]
            if want > sum(nbytes for _, nbytes in split):
                raise TvmschedError(f"the plan's GPU {entry.get('id')} uses more {kind} than the topology has left")
        if entry.get("id") == gpu:
            return shares
    raise AssertionError("not reached")


class TierShares:
    """What this runtime has left of its tier shares; every tiered model takes what it places."""

    def __init__(self, settings: TierSettings, shares: list[tuple[Tier, int]] | None = None):
        self.settings = settings
        self.left = [[tier, share] for tier, share in (settings.shares() if shares is None else shares)]

    def engine_tiers(self) -> list[dict]:
        """The shares left, as the engine's load_tiered takes them."""
        return [{"kind": tier.kind, "capacity_bytes": int(left),
                 "numa_node": -1 if tier.numa_node is None else int(tier.numa_node), "path": str(tier.path or "")}
                for tier, left in self.left]

    def take(self, info) -> None:
        """Subtract what a loaded model placed (tiering_info's tiers, in engine_tiers order)."""
        for entry, placed in zip(self.left, info["tiers"]):
            entry[1] -= int(placed["used_bytes"])

    def give_back(self, info) -> None:
        """Add back what an unloaded model had placed (the `info` `take` was given)."""
        for entry, placed in zip(self.left, info["tiers"]):
            entry[1] += int(placed["used_bytes"])
