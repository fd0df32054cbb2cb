"""Liveness-based reuse of activation buffers: one storage block serves many tensors over time.

The plan is the engine's (runtime/native: PlanMemory, greedy best fit over the layer order); this is
its Python view, for inspection and tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from tvmsched.runtime import native


@dataclass(frozen=True)
class MemoryPlan:
    storage_bytes: tuple[int, ...]  # size of each storage block
    assignment: dict[str, int]  # activation tensor id -> storage block

    @property
    def total_bytes(self) -> int:
        return sum(self.storage_bytes)


def plan_activations(layers, tensors: dict, keep: set[str], reuse_distance: int = 1) -> MemoryPlan:
    """The engine's plan for `layers` (objects with `.inputs`, `.outputs`, in execution order).

    Args:
        tensors: tensor id -> spec with `.nbytes` (every layer output must be there).
        keep: tensors that must live to the end (the model outputs).
        reuse_distance: a tensor's storage is reused only by layers at least this many layers after
            its last use, so any `reuse_distance` consecutive layers can be run again (preemption
            re-runs the launches that were in flight).
    """
    outputs = {t for layer in layers for t in layer.outputs}
    storage, assignment = native.plan_activation_storage([[list(layer.inputs), list(layer.outputs)] for layer in layers],
                                              {t: tensors[t].nbytes for t in outputs}, sorted(keep), reuse_distance)
    return MemoryPlan(tuple(int(n) for n in storage), {str(k): int(v) for k, v in assignment.items()})
