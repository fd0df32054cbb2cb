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

Tensor cores come first: a matmul-like layer with fp16 operands on sm_70 or later takes dlight's WMMA schedule
(`MatmulTensorization`: 16x16x16 fragments, fp32 accumulation) before any SIMT tile or split-K is considered,
wherever padding its outputs to 32 x 32 tiles costs at most `MAX_TENSOR_CORE_PADDING` times the work. dlight fixes
its tile at 128 x 128 outputs (16 warps), so a batch-1 layer launches a handful of blocks (BERT-tiny's
projections: one); here the tile is chosen per layer from 16 x 16 (one warp, one fragment) up, as for SIMT tiles
(`tensor_core_tiles`), by replaying dlight's schedule with that tile's factors (`tensor_core_schedule`): a layer
below one wave at 32 x 32 gets up to 4x the blocks (BERT-base's 128 x 768 projections: 192 blocks of 32 x 16 on 132
SMs, against 96 of 32 x 32). dlight's
own matmul rule would not tensorize these layers at all: it does so only when every non-batch extent exceeds 64
(leaving head-dim-64 attention and 64-channel convolutions on SIMT cores), and it reads the architecture as a bare
number, so `sm_90a` (the H100 / H200 target) never tensorizes there. Row reductions (layer norm, softmax) take a
warp per row where rows are short (`RowReduction`). Each layer's path (`GpuPath`: tensor cores, split-K, SIMT, a
warp or a block per row) and the reason are recorded on the scheduled PrimFunc; `tvmsched inspect` shows them with
each path's share of the model's FLOPs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
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
    shape = matmul_shape(func)
    return None if shape is None else shape[0]


def matmul_shape(func) -> tuple[tuple[int, int, int, int], str] | None:
    """(S, I, J, K) of a matmul-like PrimFunc (`matmul_extents`) and the dtype of the operands it multiplies, or None."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import get_root_block
    from tvm.s_tir.dlight.gpu.matmul import IterKind, detect_iter_traits, get_reduction_blocks

    sch = s_tir.Schedule(func)
    reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
    if not reductions:
        return None
    block = sch.get(reductions[0])
    traits = detect_iter_traits(block)
    if traits is None or not block.reads:
        return None
    extents = {kind: 1 for kind in (IterKind.kIter_S, IterKind.kIter_I, IterKind.kIter_J, IterKind.kIter_K)}
    for trait in traits[3]:
        if not isinstance(trait.extent, tirx.IntImm):
            return None
        if trait.kind in extents:
            extents[trait.kind] *= int(trait.extent.value)
    return tuple(extents.values()), str(block.reads[0].source.dtype)


TENSOR_CORES, SPLIT_K, SIMT = "tensor cores", "split-K", "SIMT"  # the paths a matmul-like layer takes
WARP_PER_ROW, BLOCK_PER_ROW = "warp per row", "block per row"  # the paths of a row reduction (RowReduction)
TENSOR_CORE_TILE = 128  # outputs per block along I and along J in dlight's WMMA schedule (MatmulTensorization)
# tile edge -> (warps, 16x16 fragments per warp) along that axis; dlight's schedule is the 128 one on both axes
TENSOR_CORE_EDGES = {128: (4, 2), 64: (2, 2), 32: (1, 2), 16: (1, 1)}
WMMA_K = 16  # the K of one WMMA fragment product (16x16x16)
MAX_TENSOR_CORE_PADDING = 4.0  # tensor cores (~15x the fp16 rate of SIMT cores) still win with up to 4x padded work
# the tile edge that padding is judged at: a layer of fewer rows or columns (a 2x2 convolution's 4) keeps split-K,
# which fills the GPU where even 16 x 16 tiles would launch a few blocks (the rule of before the 16-wide tiles)
TENSOR_CORE_PADDING_EDGE = 32


STATIC_SHARED_TILE = 64 * 64  # the largest tile (outputs) whose operands are staged in static shared memory


def tensor_core_padding(i: int, j: int, ti: int, tj: int) -> float:
    """The work of I x J outputs padded to ti x tj tiles, over the real work."""
    return math.ceil(i / ti) * math.ceil(j / tj) * ti * tj / (i * j)


def tensor_core_pad_factor(extent: int, edge: int) -> int:
    """What the schedule of a tile `edge` wide pads `extent` to a multiple of: the edge, except where the edge divides
    the extent and dlight's 128 does not. There it is 128, as in dlight's own schedule: its trace, replayed with the
    smaller tile, inlines the padding's producer block, and a tile that needed no padding would leave that step
    nothing to act on (the replay fails: ResNet-50's 3136 x 64 layers kept dlight's 25 blocks of 128 x 128)."""
    return TENSOR_CORE_TILE if extent % edge == 0 and extent % TENSOR_CORE_TILE else edge


def tensor_core_blocks(s: int, i: int, j: int, ti: int, tj: int) -> int:
    """The blocks a C[s, i, j] layer launches with ti x tj tiles (its outputs padded as `tensor_core_pad_factor`)."""
    def tiles(extent: int, edge: int) -> int:
        factor = tensor_core_pad_factor(extent, edge)
        return math.ceil(extent / factor) * factor // edge

    return s * tiles(i, ti) * tiles(j, tj)


def tensor_core_tiles(s: int, i: int, j: int, sms: int) -> list[tuple[int, int]]:
    """The tensor-core tiles (ti, tj) of a C[s, i, j] layer for a GPU of `sms` SMs, best first, as `choose_tiling` ranks
    SIMT tiles: those whose launch covers every SM at least once, largest first, then the others, most blocks first;
    only tiles padding the layer to at most MAX_TENSOR_CORE_PADDING times its work (less padding breaks ties); dlight's
    own 128 x 128 last in any case (a layout the smaller tiles' replay does not take still gets tensor cores)."""
    def blocks(t):
        return tensor_core_blocks(s, i, j, *t)

    def padding(t):  # the work done, padding included, over the layer's
        return blocks(t) * t[0] * t[1] / (s * i * j)

    tiles = [(ti, tj) for ti in TENSOR_CORE_EDGES for tj in TENSOR_CORE_EDGES
             if padding((ti, tj)) <= MAX_TENSOR_CORE_PADDING and ti * tj <= STATIC_SHARED_TILE]
    ranked = sorted(tiles, key=lambda t: (blocks(t) >= sms, t[0] * t[1] if blocks(t) >= sms else blocks(t),
                                          -padding(t)), reverse=True)
    dlight = (TENSOR_CORE_TILE, TENSOR_CORE_TILE)
    return [t for t in ranked if t != dlight] + [dlight]


@dataclass(frozen=True)
class GpuPath:
    """How a matmul-like layer (TENSOR_CORES, SPLIT_K or SIMT) or a row reduction (WARP_PER_ROW, BLOCK_PER_ROW) runs on
    the GPU, and why."""

    path: str
    reason: str


def sm_version(target) -> int:
    """The compute capability of a CUDA target as a number (sm_90a: 90); 0 where the target names none."""
    found = re.match(r"sm_(\d+)", str(target.attrs.get("arch", "")))
    return int(found.group(1)) if found else 0


def tensor_core_refusal(extents: tuple[int, int, int, int], dtype: str, sm: int) -> str | None:
    """Why a C[S, I, J] += A[S, I, K] * B[S, J, K] layer of `dtype` operands cannot take the tensor-core schedule on
    an sm_`sm` GPU, or None where it can."""
    if sm < 70:
        return f"sm_{sm} has no fp16 tensor cores (they need sm_70 or later)"
    if dtype != "float16":
        return f"{dtype} operands (tensor cores take fp16: tvmsched compile --precision fp16)"
    _, i, j, k = extents
    if k < WMMA_K:
        return f"K = {k} is shorter than one {WMMA_K}x{WMMA_K}x{WMMA_K} WMMA step"
    edge = TENSOR_CORE_PADDING_EDGE
    padded = tensor_core_padding(i, j, edge, edge)
    if padded > MAX_TENSOR_CORE_PADDING:
        return (f"{i}x{j} outputs padded to {edge}x{edge} tiles would be {padded:.0f}x the work "
                f"(at most {MAX_TENSOR_CORE_PADDING:g}x)")
    return None


def default_rules(sms: int) -> list:
    """dlight's GPU rules in their usual order, the matmul rule tiled for `sms` SMs, rows reduced by a warp where short."""
    from tvm.s_tir import dlight as dl

    return [WaveMatmul(sms), dl.gpu.GEMV(), dl.gpu.Reduction(), RowReduction(), dl.gpu.Fallback()]


WARP = 32
DLIGHT_ROW_THREADS = 256  # dlight's GeneralReduction: 256 threads per row on CUDA, whatever the row's length
MIN_PER_THREAD = 8  # elements each thread of a row reduction sums at least, where the row is long enough


def row_threads(n: int) -> int:
    """Threads that reduce a row of `n` elements: a warp (shuffles only, no shared memory or block barrier) up to
    WARP * MIN_PER_THREAD elements, else the power of two giving each thread at least MIN_PER_THREAD, at most dlight's 256."""
    threads = WARP
    while threads < DLIGHT_ROW_THREADS and n > threads * MIN_PER_THREAD:
        threads *= 2
    return threads


def reduced_row(func) -> int | None:
    """The elements of one row of a row-reduction PrimFunc (layer norm, softmax: its first block's reduction extents
    multiplied), or None where an extent is symbolic or there is no reduction."""
    from tvm import s_tir, tirx
    from tvm.s_tir.dlight.analysis import normalize_prim_func

    infos = normalize_prim_func(s_tir.Schedule(func))
    if not infos:
        return None
    n = 1
    for it in infos[0].iters:
        if it.kind == "R":
            extent = it.dom.value if isinstance(it.dom, tirx.IntImm) else it.dom
            if not isinstance(extent, int):
                return None
            n *= extent
    return n if n > 1 else None


@functools.cache
def _row_reduction_class():
    from tvm import s_tir, tirx
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.schedule import Instruction, Trace

    class _RowReduction(dl.gpu.GeneralReduction):
        """dlight's GeneralReduction (a block per row, its reductions and epilogue in that block) with the row's thread
        count chosen from its length (`row_threads`) instead of 256 for every row: BERT's rows of 128 elements left half
        of each block's threads idle and paid two block barriers per reduction; a warp reduces them with shuffles alone."""

        def apply(self, func, target, tunable):
            return self.schedule_and_path(func, target, tunable)[0]

        def schedule_and_path(self, func, target, tunable):
            """`apply`'s schedule and the layer's path (a GpuPath, or None where it is not a row reduction)."""
            sch = super().apply(func, target, tunable)
            n = reduced_row(func) if isinstance(sch, s_tir.Schedule) and describe(target).gpu else None
            if n is None:
                return sch, None
            threads = row_threads(n)
            splits = [i for i in sch.trace.insts if i.kind.name == "Split"]
            if threads != DLIGHT_ROW_THREADS and splits and all(
                    isinstance(i.inputs[-1], tirx.IntImm) and int(i.inputs[-1].value) == DLIGHT_ROW_THREADS for i in splits):
                insts = [Instruction(i.kind, [*i.inputs[:-1], tirx.IntImm(i.inputs[-1].ty, threads)], i.attrs, i.outputs)
                         if i.kind.name == "Split" else i for i in sch.trace.insts]
                sch = s_tir.Schedule(func)
                Trace(insts, {}).apply_to_schedule(sch, remove_postproc=False)
            else:
                threads = DLIGHT_ROW_THREADS
            per = math.ceil(n / threads)
            kind = WARP_PER_ROW if threads == WARP else BLOCK_PER_ROW
            return sch, GpuPath(kind, f"rows of {n} elements: {threads} threads, {_count(per, 'element')} each")

    return _RowReduction


def RowReduction():  # noqa: N802 - a rule object, named like dlight's rules
    """dlight's `gpu.GeneralReduction` with a warp per row where rows are short."""
    return _row_reduction_class()()


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
            return self.schedule_and_path(func, target, tunable)[0]

        def schedule_and_path(self, func, target, tunable):
            """`apply`'s schedule and the layer's path: tensor cores, split-K or SIMT with the reason (a GpuPath; None
            where the layer is not matmul-like on a GPU)."""
            shape = matmul_shape(func) if describe(target).gpu else None
            if shape is None:
                return super().apply(func, target, tunable), None
            extents, dtype = shape
            refusal = tensor_core_refusal(extents, dtype, sm_version(target))
            if refusal is None:
                sch, (ti, tj) = first_tensor_core_schedule(func, target, extents, self.sms)
                if sch is not None:
                    blocks = tensor_core_blocks(*extents[:3], ti, tj)
                    warps = TENSOR_CORE_EDGES[ti][0] * TENSOR_CORE_EDGES[tj][0]
                    return sch, GpuPath(TENSOR_CORES, f"fp16 WMMA {WMMA_K}x{WMMA_K}x{WMMA_K}, fp32 accumulation, "
                                                      f"{ti}x{tj} outputs per block of {_count(warps, 'warp')}, "
                                                      f"{_count(blocks, 'block')}")
                refusal = "dlight's tensor-core schedule does not take this layer's layout"
            func = func.with_attr("dlight.do_not_tensorize", True)  # the path is decided here, not in dlight's rule
            self._tiling = choose_tiling(*extents, self.sms)
            try:
                if self._tiling.split_k > 1:
                    sch = schedule_split_k(func, self._tiling, self.sms, unroll=self.get_configs(target).unroll)
                    if sch is not None:
                        ti, tj = self._tiling.tile
                        return sch, GpuPath(SPLIT_K, f"no tile fills {self.sms} SMs: {ti}x{tj} tiles, K split "
                                                     f"in {self._tiling.split_k}; {refusal}")
                    self._tiling = choose_tiling(*extents[:3], 0, self.sms)  # the most blocks without a split
                try:
                    sch = super().apply(func, target, tunable)
                except AssertionError:  # the epilogue dlight cannot inline (dlight_tensor_core_schedule): a later rule
                    return None, GpuPath(SIMT, "dlight's matmul schedules cannot inline this layer's epilogue (an "
                                               "output padded, as EfficientNet's): a later rule's schedule; " + refusal)
                if sch is None:
                    return None, None
                ti, tj = self._tiling.tile
                blocks = self._tiling.blocks(*extents[:3])
                return sch, GpuPath(SIMT, f"{ti}x{tj} tiles, {_count(blocks, 'block')}; {refusal}")
            finally:
                self._tiling = None

    return _WaveMatmul


def _count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


TWIN_SUFFIX = "__twin"  # a twin intrinsic: a registered tensor intrinsic whose implementation is its description


def dlight_tensor_core_schedule(func, target):
    """dlight's WMMA schedule of a matmul-like PrimFunc (`MatmulTensorization`: 128 x 128 outputs per block), or None
    where the layer does not take it (dlight asserts where it cannot inline a layer's epilogue into the stage that
    writes the accumulator back: no tensor cores for that layer)."""
    from tvm.s_tir.dlight.gpu.matmul import MatmulTensorization

    from tvmsched.lower.intrinsics import load_tensor_intrinsics

    load_tensor_intrinsics()
    try:
        with target:
            return MatmulTensorization().apply(func, target, False)
    except AssertionError:  # its consumer chain not inlined (EfficientNet's, MobileNet-v2's fused epilogues): no WMMA
        return None


def tensor_core_schedule(func, target, dlight, tile: tuple[int, int], *, twin: bool = False):
    """`dlight` (`dlight_tensor_core_schedule(func, target)`) with `tile` outputs per block: its trace replayed with the
    factors that make its fixed 128 x 128 tile (the padding, the warps and fragments along I and J, the warps sharing
    each shared-memory load) set for `tile` (TENSOR_CORE_EDGES). With `twin`, every tensorized block (WMMA fill, load,
    multiply, store) becomes its intrinsic's description instead: the same loops, tiles and buffers, each fragment
    operation spelt out as the plain TIR it stands for, so that the schedule can be checked on a CPU (its thread
    bindings made serial). None where the layer does not take that tile."""
    from tvm import s_tir, tirx
    from tvm.s_tir import TensorIntrin
    from tvm.s_tir.schedule import Instruction, Trace

    if tuple(tile) == (TENSOR_CORE_TILE, TENSOR_CORE_TILE) and not twin:
        return dlight
    (wi, fi), (wj, fj) = TENSOR_CORE_EDGES[tile[0]], TENSOR_CORE_EDGES[tile[1]]
    extents = matmul_shape(func)[0]
    dlight_warps, dlight_frags = TENSOR_CORE_EDGES[TENSOR_CORE_TILE]
    factors = {  # dlight's factor lists -> those of `tile`
        (None, 1, dlight_warps, dlight_frags): (None, 1, wi, fi),
        (1, None, dlight_warps, dlight_frags): (1, None, wj, fj),
        (None, dlight_warps * dlight_warps, 32, 4): (None, wi * wj, 32, 4),
    }

    # below dlight's tile, the fp16 operands are staged through static shared memory and the fp32 accumulator keeps
    # the dynamic one: with all three in one scope, TVM reuses an operand's buffer for the accumulator and the build
    # fails ("tvm_access_ptr element type must match the source buffer"); such tiles' operands fit the static 48 KB
    static = tile[0] * tile[1] <= STATIC_SHARED_TILE

    def value(x):
        return int(x.value) if isinstance(x, tirx.IntImm) else x

    insts, rewritten = [], 0
    for inst in dlight.trace.insts:
        kind = inst.kind.name
        if kind == "PadEinsum":
            padding = [int(x) for x in inst.attrs[0]]
            factors_ij = [tensor_core_pad_factor(e, t) for e, t in zip(extents[1:3], tile)]
            inst = Instruction(inst.kind, inst.inputs, [[padding[0], *factors_ij, *padding[3:]]], inst.outputs)
            rewritten += 1
        elif kind == "Split" and tuple(value(x) for x in inst.inputs[1:]) in factors:
            new = factors[tuple(value(x) for x in inst.inputs[1:])]
            ty = next(x.ty for x in inst.inputs[1:] if isinstance(x, tirx.IntImm))
            inputs = [inst.inputs[0], *(None if f is None else tirx.IntImm(ty, f) for f in new)]
            inst = Instruction(inst.kind, inputs, inst.attrs, inst.outputs)
            rewritten += 1
        elif kind == "CacheRead" and static and str(inst.attrs[1]) == "shared.dyn":
            inst = Instruction(inst.kind, inst.inputs, [inst.attrs[0], "shared", *inst.attrs[2:]], inst.outputs)
        elif kind == "Tensorize":
            name = str(inst.attrs[0])
            if static and name.startswith("wmma_load_") and name.endswith("_shared_dyn"):
                name = name.removesuffix("_dyn")
            if twin:
                if TensorIntrin.get(name + TWIN_SUFFIX, allow_missing=True) is None:
                    desc = TensorIntrin.get(name).desc
                    TensorIntrin.register(name + TWIN_SUFFIX, desc, desc)
                name += TWIN_SUFFIX
            inst = Instruction(inst.kind, inst.inputs, [name, *inst.attrs[1:]], inst.outputs)
        insts.append(inst)
    if rewritten != 5:  # one padding, the I and J splits, the two shared-memory loads: dlight's schedule changed
        return None
    replayed = s_tir.Schedule(func)
    try:
        with target:
            Trace(insts, {}).apply_to_schedule(replayed, remove_postproc=False)
    except Exception:  # noqa: BLE001 - a layout the smaller tile does not take: the caller falls back
        return None
    return replayed


def first_tensor_core_schedule(func, target, extents: tuple[int, int, int, int], sms: int, *, twin: bool = False):
    """(schedule, tile) of the first of `tensor_core_tiles` whose schedule the layer takes (dlight's schedule computed
    once, replayed per tile); (None, (None, None)) if none does."""
    dlight = dlight_tensor_core_schedule(func, target)
    if dlight is None:
        return None, (None, None)
    for tile in tensor_core_tiles(*extents[:3], sms):
        sch = tensor_core_schedule(func, target, dlight, tile, twin=twin)
        if sch is not None:
            return sch, tile
    return None, (None, None)


def intrinsic_twin(func, target, sms: int):
    """The CPU twin (`tensor_core_schedule(..., twin=True)`) of the tensor-core schedule a matmul-like PrimFunc gets on
    a GPU of `sms` SMs (the same tile); None where it takes none."""
    shape = matmul_shape(func)
    if shape is None:
        return None
    sch, _ = first_tensor_core_schedule(func, target, shape[0], sms, twin=True)
    return None if sch is None else sch.mod["main"]


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
