"""Liveness-based reuse of activation buffers: one storage block serves many tensors over time."""

from __future__ import annotations

from dataclasses import dataclass

_ALIGN = 64


@dataclass(frozen=True)
class MemoryPlan:
    storage_bytes: tuple[int, ...]  # size of each storage block
    assignment: dict[str, int]  # activation tensor id -> storage block

    @property
    def total_bytes(self) -> int:
        return sum(self.storage_bytes)


def plan_memory(layers, tensors: dict, keep: set[str], reuse_distance: int = 1) -> MemoryPlan:
    """Greedy best-fit reuse over the layer order.

    Args:
        layers: objects with `.index`, `.inputs`, `.outputs`, in execution order.
        tensors: tensor id -> spec with `.kind` and `.nbytes`.
        keep: tensors that must live to the end (the model outputs).
        reuse_distance: a tensor's storage is reused only by layers at least this many layers after
            its last use, so any `reuse_distance` consecutive layers can be run again (preemption
            re-runs the launches that were in flight).
    """
    last_use = {t: layer.index + reuse_distance - 1 for layer in layers for t in (*layer.outputs, *layer.inputs)}
    sizes: list[int] = []
    free: list[int] = []
    assignment: dict[str, int] = {}
    for layer in layers:
        for tensor_id in layer.outputs:
            need = -(-tensors[tensor_id].nbytes // _ALIGN) * _ALIGN
            block = None if tensor_id in keep else _best_fit(free, sizes, need)
            if block is None:
                sizes.append(need)
                block = len(sizes) - 1
            else:
                free.remove(block)
                sizes[block] = max(sizes[block], need)
            assignment[tensor_id] = block
        for tensor_id, block in assignment.items():
            if tensor_id not in keep and last_use[tensor_id] == layer.index:
                free.append(block)
    return MemoryPlan(tuple(sizes), assignment)


def _best_fit(free: list[int], sizes: list[int], need: int) -> int | None:
    """The smallest free block that fits, else the largest free block (grown later), else None."""
    if not free:
        return None
    fitting = [b for b in free if sizes[b] >= need]
    return min(fitting, key=sizes.__getitem__) if fitting else max(free, key=sizes.__getitem__)
