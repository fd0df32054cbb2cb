"""Default CUDA schedules that fill the GPU: dlight's rules, with matmul-like layers tiled for a full wave.

dlight's `gpu.Matmul` gives every matmul-like layer (matmuls, convolutions, batched attention products) one
tile of 32 x 64 outputs per thread block. On a 132-SM GPU most layers of a batch-1 model then launch far
less than one wave (ResNet-18's 7x7x512 convolutions: 16 blocks; BERT-tiny's 128x128 matmuls: 8) and the
other SMs idle. Here each matmul-like layer gets its tile from its own shape (`choose_tiling`):

- the largest tile (most data reuse per block) whose launch still covers every SM at least once;
- where even the smallest tile cannot, the reduction is split (split-K): each block sums a slice of K into
  a partial buffer, and a second launch adds the slices up and runs the layer's epilogue (bias, residual
  add, activation). The partial sums are an intermediate buffer of their own, so the layer stays idempotent.

The SM count comes from the target's architecture (`tvmsched.lower.targets.gpu_sms`; TVMSCHED_GPU_SMS overrides
it). Every other layer keeps dlight's rules (GEMV, reductions, element-wise fallback), which already launch
one block per 256-1024 outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from tvmsched.lower.targets import describe

# (threads along I, threads along J, outputs per thread along I, along J); I rows, J columns of the tile.
_THREADS = ((8, 16), (16, 8), (16, 16), (8, 8))
_MICRO = (4, 2, 1)
MICRO_K = 16  # the reduction is staged through shared memory MICRO_K elements at a time
MIN_SPLIT_K = MICRO_K  # a split-K slice sums at least one shared-memory stage


@dataclass(frozen=True)
class Tiling:
    """How one matmul-like layer C[S, I, J] += A[S, I, K] * B[S, J, K] is laid over the GPU."""

    threads_i: int
    threads_j: int
    micro_i: int
    micro_j: int
    split_k: int = 1  # slices of K summed by separate blocks (1: no split)

    @property
    def tile(self) -> tuple[int, int]:
        return self.threads_i * self.micro_i, self.threads_j * self.micro_j

    def blocks(self, s: int, i: int, j: int) -> int:
        ti, tj = self.tile
        return s * math.ceil(i / ti) * math.ceil(j / tj) * self.split_k


def choose_tiling(s: int, i: int, j: int, k: int, sms: int) -> Tiling:
    """The tiling of a C[s, i, j] += A[s, i, k] * B[s, j, k] layer for a GPU of `sms` SMs.

    Among the tilings that launch at least one block per SM, the one with the largest tile (fewest global
    loads per output), tie-broken by less padding and then by 128 threads; where none does, K is split in
    as few slices as reach a wave (fewer partial sums to write and add up), with the largest tile that needs
    no more; where that cannot either (a K shorter than the slices needed), the tiling with the most blocks.
    """
    tilings = [Tiling(ti, tj, mi, mj) for ti, tj in _THREADS for mi in _MICRO for mj in _MICRO]

    def waste(t: Tiling) -> float:  # padded outputs over real ones
        ti, tj = t.tile
        return (math.ceil(i / ti) * ti * math.ceil(j / tj) * tj) / (i * j)

    def rank(t: Tiling):
        ti, tj = t.tile
        return (ti * tj / waste(t) ** 2, -abs(t.threads_i * t.threads_j - 128), t.micro_j)

    full = [t for t in tilings if t.blocks(s, i, j) >= sms]
    if full:
        return max(full, key=rank)
    splits = []
    for t in tilings:  # split K: for each tile, the fewest slices of >= MIN_SPLIT_K that reach a wave
        for want in range(2, k // MIN_SPLIT_K + 1):
            split = dataclasses.replace(t, split_k=slices_of(k, want))
            if split.blocks(s, i, j) >= sms:
                splits.append(split)
                break
    if splits:
        return max(splits, key=lambda t: (-t.split_k, rank(t)))
    return max(tilings, key=lambda t: (t.blocks(s, i, j), rank(t)))


def slice_length(k: int, split: int) -> int:
    """The length of each of `split` slices of a K axis of extent k (a multiple of MICRO_K; the last slice padded)."""
    return math.ceil(math.ceil(k / split) / MICRO_K) * MICRO_K


def slices_of(k: int, split: int) -> int:
    """How many slices a split of K into `split` gives once each is a multiple of MICRO_K long."""
    return math.ceil(k / slice_length(k, split))


def matmul_extents(func) -> tuple[int, int, int, int] | None:
    """(S, I, J, K) of a matmul-like PrimFunc as dlight normalizes it (every axis of one kind fused), or
    None: not matmul-like, or a symbolic extent."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import IterKind, detect_iter_traits, get_reduction_blocks

    sch = s_tir.Schedule(func)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions:
        return None
    traits = detect_iter_traits(sch.get(reductions[0]))
    if traits is None:
        return None
    extents = {kind: 1 for kind in (IterKind.kIter_S, IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K)}
    for trait in traits[3]:
        if not isinstance(trait.extent, tirx.IntImm):
            return None
        if trait.kind in extents:
            extents[trait.kind] *= int(trait.extent.value)
    return tuple(extents.values())


def default_rules(sms: int) -> list:
    """dlight's GPU rules in their usual order, the matmul rule tiled for `sms` SMs."""
    from tvm.s_tir import dlight as dl

    return [WaveMatmul(sms), dl.gpu.GEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback()]


@functools.cache
def _wave_matmul_class():
    from tvm.s_tir import dlight as dl

    class _WaveMatmul(dl.gpu.Matmul):
        """dlight's matmul rule with the tile chosen per layer (`choose_tiling`) and split-K where needed."""

        def __init__(self, sms: int) -> None:
            super().__init__()
            self.sms = sms
            self._tiling: Tiling | None = None

        def get_configs(self, target):
            config = super().get_configs(target)
            t = self._tiling
            if t is None or not describe(target).gpu:
                return config
            vector = 2 if t.micro_i % 2 == 0 and t.micro_j % 2 == 0 else 1
            return dl.gpu.Matmul.Config(
                block_size_x=t.threads_i, block_size_y=t.threads_j, micro_size_x=t.micro_i, micro_size_y=t.micro_j,
                micro_size_k=MICRO_K, vector_size=vector, unroll=config.unroll, use_shared=True,
                storage_align=config.storage_align, inner_x=False,
            )

        def apply(self, func, target, tunable):
            extents = matmul_extents(func) if describe(target).gpu else None
            if extents is None:
                return super().apply(func, target, tunable)
            self._tiling = choose_tiling(*extents, self.sms)
            try:
                if self._tiling.split_k > 1:
                    sch = schedule_split_k(func, self._tiling, self.sms, unroll=self.get_configs(target).unroll)
                    if sch is not None:
                        return sch
                    self._tiling = choose_tiling(*extents[:3], 0, self.sms)  # the most blocks without a split
                return super().apply(func, target, tunable)
            finally:
                self._tiling = None

    return _WaveMatmul


def WaveMatmul(sms: int):  # noqa: N802 - a rule object, named like dlight's rules
    """dlight's `gpu.Matmul` with each layer's tile chosen to fill `sms` SMs."""
    return _wave_matmul_class()(sms)


def schedule_split_k(func, tiling: Tiling, sms: int, *, unroll: int = 256):
    """A matmul-like PrimFunc scheduled as two launches: blocks of `tiling.tile` outputs each summing one of
    `tiling.split_k` slices of K into a partial buffer P[slice, S, I, J] (operands staged through shared
    memory, MICRO_K at a time), then one thread per output adding the slices and running the epilogue.
    None where the layer does not take this form (dlight's plain rule then applies)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import get_index_map, get_reduction_blocks

    sch = s_tir.Schedule(func)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions or len(reductions) != 1:
        return None
    main = reductions[0]
    try:
        # C[S, I, J] += A[S, I, K] * B[S, J, K], as dlight's matmul rule normalizes it
        a, b, c = (sch.reindex(main, ("read", 0)), sch.reindex(main, ("read", 1)), sch.reindex(main, ("write", 0)))
        matmul_map, a_map, b_map, c_map = get_index_map(sch.get(main))
        sch.transform_layout(a, ("write", 0), a_map)
        sch.transform_layout(b, ("write", 0), b_map)
        sch.transform_layout(c, ("read", 0), c_map)
        sch.transform_block_layout(main, matmul_map)
        k_slice = slice_length(int(sch.get(sch.get_loops(main)[-1]).extent), tiling.split_k)
        ti, tj = tiling.tile
        sch.pad_einsum(main, [1, ti, tj, k_slice])
        batch, i, j, k = sch.get_loops(main)
        slices, k = sch.split(k, [None, k_slice])
        partial = sch.rfactor(slices, factor_axis=0)  # P[slice, S, I, J]; `main` now sums over the slices
        _schedule_slices(sch, partial, tiling, unroll)
        _schedule_slice_sum(sch, main, sms)
    except Exception:  # noqa: BLE001 - a layout the split does not take: the caller falls back to dlight's rule
        return None
    return sch


def _schedule_slices(sch, partial, tiling: Tiling, unroll: int) -> None:
    """Split-K's launch 1: each block one tile of one slice of K, operands staged through shared memory."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_producers

    batch, i, j, slices, k = sch.get_loops(partial)
    bi, ti_, mi = sch.split(i, [None, tiling.threads_i, tiling.micro_i])
    bj, tj_, mj = sch.split(j, [None, tiling.threads_j, tiling.micro_j])
    ko, ki = sch.split(k, [None, MICRO_K])
    sch.reorder(slices, batch, bj, bi, tj_, ti_, ko, ki, mi, mj)
    sch.bind(sch.fuse(slices, batch, bj), "blockIdx.y")
    sch.bind(bi, "blockIdx.x")
    sch.bind(tj_, "threadIdx.y")
    sch.bind(ti_, "threadIdx.x")
    if unroll > 0:
        sch.annotate(ti_, ann_key="pragma_auto_unroll_max_step", ann_val=unroll)
        sch.annotate(ti_, ann_key="pragma_unroll_explicit", ann_val=1)
    local = sch.cache_write(partial, 0, "local")
    sch.reverse_compute_at(local, ti_, preserve_unit_loops=True)
    for operand in (0, 1):
        shared = sch.cache_read(partial, operand, "shared")
        sch.compute_at(shared, ko, preserve_unit_loops=True)
        loops = sch.get_loops(shared)[-len(sch.get(shared).iter_vars):]
        ty, tx, _ = sch.split(sch.fuse(*loops), [tiling.threads_j, tiling.threads_i, None])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        auto_inline_producers(sch, shared)
    sch.decompose_reduction(partial, ko)


def _schedule_slice_sum(sch, main, sms: int) -> None:
    """Split-K's launch 2: one thread per output sums the slices; the epilogue follows in registers."""
    from tvm.s_tir.dlight.gpu.matmul import auto_inline_consumer_chain

    batch, i, j, slices = sch.get_loops(main)
    outputs, threads = int(sch.get(batch).extent) * int(sch.get(i).extent) * int(sch.get(j).extent), 128
    while threads > 1 and math.ceil(outputs / threads) < sms:  # a wave of blocks, however few the outputs
        threads //= 2
    bx, tx = sch.split(sch.fuse(batch, i, j), [None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    total = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(total, tx, preserve_unit_loops=True)
    auto_inline_consumer_chain(sch, total)
    sch.decompose_reduction(main, slices)
