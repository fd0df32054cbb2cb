"""Pipelined fast switching (mechanism C, PipeSwitch-style): serve more models than device memory holds.

The mechanism is the engine's switcher (runtime/native/src/switching.cc): registered models keep their
weights in pinned host memory; a request for a model that is not resident starts its task's stages:
stage 1 (environment: kernel library, kernels, streams, input/output buffers), stage 2 per sub-task
(device memory of a group of consecutive layers and the copy of its weights), execution (the model's
stream launches a sub-task's layers as soon as it is prepared, while the next one is copied) and
cleaning; the least recently used idle models are evicted when memory is wanted. docs/switching.md
has the rules, settings and what each stage costs.

    rt = Runtime("cpu", memory_budget=64 << 20, switching=SwitchSettings(preset_count=2))
    for path in artifacts:
        rt.load(path)            # resident while they fit, registered after that
    rt.submit("bert", inputs)    # switches bert in if it is not resident
    rt.switch_events()           # the recorded stages (also in export_timeline)
"""

from __future__ import annotations

from dataclasses import dataclass

from tvmsched.runtime import native
from tvmsched.errors import TvmschedError

STAGES = ("stage1", "stage2", "exec", "clean", "evict")


@dataclass(frozen=True)
class SwitchSettings:
    """The pipeline's settings (docs/switching.md); sizes in bytes, 0 takes the default.

    threshold1: memory the environments prepared ahead may hold (default: a quarter of the budget);
        stage 1 of further tasks pauses beyond it, and evicted models drop their environments.
    threshold2: memory the running and prepared sub-tasks of switching models may hold (default: the budget).
    preset_count: the next task's first stage 2 waits until fewer of the current task's sub-tasks are
        unexecuted than this.
    retain: keep a switched-in model resident until it is evicted (least recently used first); False
        cleans every sub-task as soon as it finishes (memory holds only what runs or is about to).
    max_groups: sub-tasks per model at most (groups of consecutive layers; 1: no pipelining).
    """

    threshold1: int = 0
    threshold2: int = 0
    preset_count: int = 2
    retain: bool = True
    max_groups: int = 8

    def __post_init__(self):
        if min(self.threshold1, self.threshold2) < 0:
            raise TvmschedError("switching thresholds cannot be negative")
        if self.preset_count < 1 or self.max_groups < 1:
            raise TvmschedError("the preset count and max_groups must be at least 1")


@dataclass(frozen=True)
class StageEvent:
    """One recorded stage of a model's task (group -1: its environment); times in engine µs."""

    model: str
    stage: str
    group: int
    start_us: float
    end_us: float
    bytes: int
    held: int  # after it: stage2: switching sub-tasks' bytes (threshold 2); stage1: environments ahead (threshold 1)


def stage_events(rows) -> list[StageEvent]:
    """The engine's event rows [model, stage, group, start_us, end_us, bytes, held]."""
    return [StageEvent(str(e[0]), str(e[1]), int(e[2]), float(e[3]), float(e[4]), int(e[5]), int(e[6])) for e in rows]


class Switcher:
    """The engine's switcher for one device: `budget` bytes (0: `memory_scope`'s budget, else the device's, else
    its free memory). With `memory_scope` (a Runtime's), only the memory of that scope's models counts as in use,
    and it takes only models loaded into that scope."""

    def __init__(self, device: str, budget: int = 0, settings: SwitchSettings = SwitchSettings(), memory_scope=None):
        self.settings = settings
        self.native = native.create_switcher(device, int(budget), settings.threshold1, settings.threshold2,
                                              settings.preset_count, settings.retain, memory_scope)
        self.options = {str(k): int(v) for k, v in self.native.options().items()}

    def add(self, executor) -> None:
        """Take a registered model (nothing is prepared until `prefetch` or a request)."""
        self.native.add(executor.native)

    def prefetch(self, executor) -> bool:
        """Prepare a model it took now if it fits without evicting anything; whether it is resident."""
        return bool(self.native.prefetch(executor.native))

    def remove(self, executor) -> bool:
        """Let go of a model nobody uses any more: its prepared memory and environment are freed; False while in use."""
        return bool(self.native.remove(executor.native))

    def events(self) -> list[StageEvent]:
        return stage_events(self.native.events())

    def on_blocked(self, callback) -> None:
        """`callback(waiting, holders)` (the engine's models, as `Executor.native`) when a model's switch-in waits
        for memory that only paused streams' started requests hold: nothing frees it until a policy lets them run.
        Once per wait, on the switcher's thread; exceptions are ignored."""
        self.native.set_blocked_callback(lambda waiting, holders: callback(waiting, list(holders)))

    def close(self) -> None:
        self.native.close()


def footprint(executor) -> int:
    """Bytes a registered model holds when resident: its environment and every sub-task."""
    return int(executor.native.env_bytes()) + sum(g["bytes"] for g in groups(executor))


def footprint_of(path, max_groups: int, device: str = "") -> int:
    """`footprint` of the artifact at `path` registered with `max_groups` sub-tasks, without loading it: it is read
    and laid out only (no pinned copy of its weights, no kernels), as the engine measures a model larger than every
    device before it splits it."""
    return native.measure_model(str(path), device, max_groups)


def groups(executor) -> list[dict]:
    """A model's sub-tasks: layers, bytes, weight bytes and state (the engine's GroupState name)."""
    names = ["absent", "preparing", "held", "ready", "leased", "finished"]
    return [{"first": int(g[0]), "last": int(g[1]), "bytes": int(g[2]), "weight_bytes": int(g[3]), "state": names[int(g[4])]}
            for g in executor.native.groups()]
