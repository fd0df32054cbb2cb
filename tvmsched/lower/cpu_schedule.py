"""Default CPU schedules: dlight-style rules that give every fused layer a reasonable schedule without search.

TVM's dlight has GEMV and reduction (softmax, norms) rules for CPU only; on its own every other legalized
loop nest runs unscheduled and single-threaded. The rules here are schedules of TVM's own kernels
(`tvm.s_tir.Schedule` primitives on the legalized PrimFuncs), tried in order on each layer:

- `TiledReduction`: a layer with one reduction (matmul, batch matmul, dense, conv2d in NHWC/HWIO —
  grouped and depthwise included —, pooling, mean) whose innermost output axis is contiguous in every
  operand it reads. Output tiles of `rows x vector` accumulate in registers: outer tiles fused and
  parallel, reduction loops, then `rows` unrolled and `vector` vectorized with the target's width;
  cheap producers (padding, casts, layout) inlined, the epilogue (bias, residual, activation)
  computed per tile.
- dlight's `cpu.GEMV`, and its `cpu.Reduction` (softmax, layer norm) where its loop nest is right.
- `Injective`: element-wise and layout chains: outer loops fused and parallel, inner loop vectorized.
- `Fallback`: anything else: each block's outer spatial loops fused and parallel.

Convolutions get this layout at compile time: `lowering.legalize_and_fuse` converts conv2d to
NHWC data / HWIO weights for CPU targets, so a vector of output channels is contiguous in the weights
and the output; `lowering.pack_weights` then packs constant matmul and one-group convolution weights
with the output channels split by this rule's vector tile ([K, N] -> [N / tv, K, tv]), so the weights one
output tile reads over its whole reduction are contiguous too.

Tuning (MetaSchedule) replaces these schedules layer by layer where it finds better ones.
"""

from __future__ import annotations

import logging
import math

from tvm import s_tir, tirx
from tvm.ir import Call, Range
from tvm.sym import Analyzer
from tvm.sym.pattern import detect_linear_equation
from tvm.s_tir import dlight as dl
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.cpu.base import CPUScheduleRule

from tvmsched.lower.targets import enabled_cpu_features, llvm_triple

log = logging.getLogger(__name__)

ACCUMULATOR_SHARE = 0.75  # of the vector registers, those kept as accumulators per tile (the rest: loads, broadcasts)
MAX_ROWS = 8
PAD_COPY_MIN_ELEMENTS = 32768  # a padded input at least this large is copied once, not tested per multiply-add,
PAD_COPY_MIN_REDUCTION = 64  # when each output sums at least this many products
MIN_PARALLEL_WORK = 2048  # output elements below which a layer stays on one thread (thread wake-up costs more)
MIN_PARALLEL_PRODUCTS = 1 << 17  # ... unless each output sums so many products that its tiles are worth the wake-up


def vector_width(target) -> int:
    """Bits of the llvm target's widest vector unit, from the CPU features its mcpu and mattr enable: 512 with
    AVX-512F, 256 with AVX, else 128 (SSE, NEON). (TVM 0.27's `llvm_get_vector_width` answers 512 for every x86 mcpu,
    AVX2-only ones such as znver3 and haswell included: its tiles then held twice the registers AVX2 has.)"""
    try:
        features = enabled_cpu_features(target)
    except Exception:  # noqa: BLE001 - an LLVM without the query: assume SSE
        return 128
    return 512 if "avx512f" in features else 256 if "avx" in features else 128


def vector_lanes(target, bits: int = 32) -> int:
    """Vector lanes of `bits`-wide elements for the llvm target (its mcpu's widest vector unit)."""
    return vector_width(target) // bits


def vector_registers(target) -> int:
    """The target's architectural vector registers: 32 with a 512-bit unit (AVX-512) or on AArch64, else 16 (x86-64's
    SSE/AVX/AVX2). A tile holding more accumulators than the registers allow spills them on every multiply-add."""
    return 32 if vector_width(target) >= 512 or llvm_triple(target).startswith(("aarch64", "arm64")) else 16


def max_accumulators(target) -> int:
    """Vector accumulators per output tile: 24 with 32 registers, 12 with 16 (AVX2's classic 6 x 2-vector tile)."""
    return int(vector_registers(target) * ACCUMULATOR_SHARE)


def rules():
    """The default CPU rules, in the order they are tried."""
    return [TiledReduction(), dl.cpu.GEMV(), RowReduction(), Injective(), Fallback()]


def default_schedule(funcs: dict[str, object], target) -> dict[str, object]:
    """{name: PrimFunc} → {name: scheduled PrimFunc} with the first rule that applies to each."""
    scheduled = {}
    for name, func in funcs.items():
        sch = schedule(func, target)
        scheduled[name] = func if sch is None else sch.mod["main"].with_attr("global_symbol", name)
    return scheduled


def schedule(func, target):
    """The default schedule of one PrimFunc (a `tvm.s_tir.Schedule` with its trace), or None to leave it as is.

    A rule that raises on an unexpected loop nest is skipped (the next rule gets the layer), so a
    layer never fails to compile because of a default schedule.
    """
    return schedule_with_rule(func, target)[1]


def schedule_with_rule(func, target):
    """(name of the rule that scheduled `func`, its schedule), or (None, None): `schedule`, saying which rule."""
    func = func.with_attr("global_symbol", "main")
    with target:
        for rule in rules():
            try:
                sch = rule.apply(func, target, False)
            except Exception as err:  # noqa: BLE001 - schedule primitives raise ScheduleError and TVMError
                log.debug("rule %s failed: %s", type(rule).__name__, str(err).splitlines()[0] if str(err) else err)
                continue
            if isinstance(sch, list):
                sch = sch[0] if sch else None
            if sch is not None:
                return type(rule).__name__, sch
    return None, None


def _extent(sch, loop) -> int | None:
    extent = sch.get(loop).extent
    return int(extent) if isinstance(extent, tirx.IntImm) else None


def _blocks(sch):
    return list(sch.get_child_blocks(get_root_block(sch)))


def _is_spatial(sch, block) -> bool:
    return all(int(iv.iter_type) == 0 for iv in sch.get(block).iter_vars)


def _try_inline(sch, blocks) -> None:
    """compute_inline each block that can be (an output block, or one with several consumers, stays)."""
    for block in blocks:
        try:
            sch.compute_inline(block)
        except Exception:  # noqa: BLE001 - ScheduleError: this block cannot be inlined
            pass


def _inline_cheap(sch, keep) -> None:
    """Inline every spatial block except `keep` (a reduction), the outputs and the padding worth a copy,
    producers and epilogues alike."""
    reduced = math.prod(_const(iv.dom.extent) or 1 for iv in sch.get(keep).iter_vars if int(iv.iter_type) != 0)
    copy_padding = reduced >= PAD_COPY_MIN_REDUCTION
    _try_inline(sch, [b for b in _blocks(sch) if _is_spatial(sch, b) and not (copy_padding and _is_padding(sch, b))])


def _is_padding(sch, block) -> bool:
    """A large block whose value is an if_then_else (a padded copy). Inlined into a convolution's reduction,
    the bounds test runs per multiply-add of every row (ResNet-18's 3x3 convs at 224x224: 2.2x slower than
    with the padded copy made first, parallel and vectorized); a small copy, or one feeding a short
    reduction (depthwise: 9 multiply-adds per output), costs more than the tests (MobileNet-V2 at 64x64)."""
    stmt = sch.get(block)
    value = getattr(stmt.body, "value", None)
    if not (isinstance(value, Call) and getattr(value.op, "name", "").endswith("if_then_else")):
        return False
    shape = [_const(d) for d in stmt.writes[0].source.shape] if len(stmt.writes) == 1 else [None]
    return None not in shape and math.prod(shape) >= PAD_COPY_MIN_ELEMENTS


def _vectorize_spatial(sch, block, lanes: int) -> None:
    """Fuse the outer loops (parallel when the block is big enough) and vectorize the innermost loop."""
    loops = sch.get_loops(block)
    if not loops:
        return
    extents = [_extent(sch, loop) for loop in loops]
    if any(e is None for e in extents):
        return
    inner = loops[-1]
    outer = loops[:-1]
    if extents[-1] >= 4 and not _has_bool(sch, block):
        factor = next(iter(vector_factors(extents[-1], lanes)), None)
        if factor is not None:
            if extents[-1] > factor:
                rest, inner = sch.split(inner, factors=[None, factor])
                outer = [*outer, rest]
            sch.vectorize(inner)
    if outer and math.prod(extents) >= MIN_PARALLEL_WORK:
        sch.parallel(sch.fuse(*outer) if len(outer) > 1 else outer[0])


def vector_factors(extent: int, lanes: int) -> list[int]:
    """The vector widths that divide `extent`, widest first: two vectors, one, half of one, 4 lanes."""
    return [f for f in (lanes * 2, lanes, lanes // 2, 4) if f >= 4 and extent % f == 0]


def _has_bool(sch, block) -> bool:
    """Whether the block reads or writes a bool buffer (LLVM stores vectors of i1 packed: wrong results)."""
    stmt = sch.get(block)
    return any(str(r.source.dtype) == "bool" for r in (*stmt.reads, *stmt.writes))


class TiledReduction(CPUScheduleRule):
    """Register-tiled reduction: parallel output tiles, reduction loops, unrolled rows x vectorized lanes."""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        lanes = vector_lanes(target)  # of 32-bit elements
        accumulators = max_accumulators(target)
        for inline_producers in (True, False):
            sch = s_tir.Schedule(func)
            reductions = [b for b in _blocks(sch) if not _is_spatial(sch, b)]
            if len(reductions) != 1:
                return None
            red = reductions[0]
            if inline_producers:
                _inline_cheap(sch, red)
            else:
                _inline_epilogues(sch, red)
            names = [sch.get(b).name_hint for b in _blocks(sch)]
            producers = names[: names.index(sch.get(red).name_hint)]  # left standing: padding (or all)
            if _tile(sch, _find(sch, red), lanes, accumulators):
                for name in producers:
                    _vectorize_spatial(sch, sch.get_sblock(name), lanes)
                return sch
        return None


def _find(sch, block):
    """The block with `block`'s name in the (possibly rewritten) schedule."""
    return sch.get_sblock(sch.get(block).name_hint)


def _inline_epilogues(sch, red) -> None:
    """Inline the spatial blocks after the reduction (not its producers)."""
    names = [sch.get(b).name_hint for b in _blocks(sch)]
    _try_inline(sch, [sch.get_sblock(n) for n in names[names.index(sch.get(red).name_hint) + 1 :]])


def _vector_reads(var, extent: int, regions, tv: int) -> bool:
    """Whether `tv` consecutive values of `var` (from a multiple of `tv`) read each region as one
    contiguous vector or one broadcast value: `var` split as `vo * tv + vi`, the lane `vi` may index
    only the last dimension, with stride 1. A grouped convolution's `ff // group_width` input channel
    is one value per vector when `tv` divides the group width."""
    dtype = var.ty.dtype
    vo = tirx.Var("vo", dtype)
    vi = tirx.Var("vi", dtype)
    analyzer = Analyzer()
    analyzer.bind(vo, Range.from_min_extent(tirx.const(0, dtype), tirx.const(max(extent // tv, 1), dtype)))
    analyzer.bind(vi, Range.from_min_extent(tirx.const(0, dtype), tirx.const(tv, dtype)))
    analyzer.bind(var, vo * tirx.const(tv, dtype) + vi)  # simplify() substitutes the split for var
    for region in regions:
        dims = [analyzer.simplify(r.min) for r in region.region]
        for i, index in enumerate(dims):
            if not _var_in(index, vi):
                continue
            if i != len(dims) - 1:
                return False
            coeff = detect_linear_equation(index, [vi])
            if len(coeff) != 2 or not isinstance(coeff[0], tirx.IntImm) or int(coeff[0]) != 1:
                return False
    return True


def _var_in(expr, var) -> bool:
    """Whether `var` occurs in `expr`."""
    return any(v.same_as(var) for v in tirx.analysis.undefined_vars(expr))


def _tile(sch, red, lanes32: int, accumulators: int) -> bool:
    """Tile the reduction block `red` (`lanes32`: the target's vector lanes of 32-bit elements; `accumulators`: the
    vector registers a tile may accumulate in); False when its innermost output axis cannot be vectorized."""
    plan = _tile_plan(sch, red, lanes32, accumulators)
    if plan is None:
        return False
    loops, spatial, reduce, extents, v, tv, u, tu = plan
    vo, vi = sch.split(loops[v], factors=[None, tv])
    # the vector tile outermost: its weight panel (reduction x tv) stays in cache across all rows
    outer = [vo] + [loops[i] for i in spatial if i not in (u, v)]
    if u is not None and tu > 1:
        uo, ui = sch.split(loops[u], factors=[None, tu])  # a ragged last tile is predicated
        outer.append(uo)
        inner = [ui, vi]
    else:
        outer += [loops[u]] if u is not None else []
        inner = [vi]
    reductions = [loops[i] for i in reduce]
    sch.reorder(*outer, *reductions, *inner)
    tile = sch.fuse(*outer) if len(outer) > 1 else outer[0]
    outputs = math.prod(extents[i] for i in spatial)
    products = outputs * math.prod(extents[i] for i in reduce)
    if (outputs >= MIN_PARALLEL_WORK or products >= MIN_PARALLEL_PRODUCTS) and (_extent(sch, tile) or 1) > 1:
        sch.parallel(tile)
    consumers = sch.get_consumers(red)
    if len(consumers) == 1 and not _is_output(sch, red):
        epilogue = consumers[0]
        sch.reverse_compute_at(epilogue, tile, preserve_unit_loops=True)
        sch.set_scope(red, 0, "local")
    else:
        epilogue = sch.cache_write(red, 0, "local")
        sch.reverse_compute_at(epilogue, tile, preserve_unit_loops=True)
    _vectorize_tile(sch, epilogue, tv)
    if len(inner) == 2:
        sch.unroll(inner[0])
    sch.vectorize(inner[-1])
    sch.decompose_reduction(red, reductions[0])  # after vectorize: the init keeps the loop kinds
    return True


def _tile_plan(sch, red, lanes32: int, accumulators: int):
    """_tile's analysis: (loops, spatial, reduction axes, extents, the vectorized axis v, its tile tv, the row axis
    u, its tile tu), or None when the block cannot be tiled (a ragged output axis is padded here)."""
    block = sch.get(red)
    if len(block.writes) != 1 or block.writes[0].source.dtype not in ("float32", "float16", "float64", "int32"):
        return None
    if _has_bool(sch, red):
        return None
    lanes = max(lanes32 * 32 // block.writes[0].source.dtype.bits, 4)
    loops = sch.get_loops(red)
    iters = list(block.iter_vars)
    if len(loops) != len(iters):
        return None
    if any(_extent(sch, loop) != int(iv.dom.extent) for loop, iv in zip(loops, iters) if isinstance(iv.dom.extent, tirx.IntImm)):
        return None
    spatial = [i for i, iv in enumerate(iters) if int(iv.iter_type) == 0]
    reduce = [i for i, iv in enumerate(iters) if int(iv.iter_type) != 0]
    if not spatial or not reduce or max(spatial) > min(reduce):
        return None
    write = [r.min for r in block.writes[0].region]
    last = write[-1] if write else None
    v = next((i for i in spatial if last is not None and last.same_as(iters[i].var)), None)
    extents = [_extent(sch, loop) for loop in loops]
    if v is None or any(e is None for e in extents):
        return None
    ev, var = extents[v], iters[v].var
    tiles = vector_factors(ev, lanes)
    tv = next((f for f in tiles if _vector_reads(var, ev, block.reads, f)), None)
    if tv is None:  # no tile reads whole vectors; or a ragged output axis (GPT-2's 50257-word head): pad it
        if tiles or ev <= lanes or not _vector_reads(var, ev, block.reads, lanes):
            return None
        try:
            sch.pad_einsum(red, [lanes if i == v else 1 for i in range(len(iters))])
        except Exception:  # noqa: BLE001 - not an einsum (pad_einsum's own conditions)
            return None
        loops = sch.get_loops(red)
        extents = [_extent(sch, loop) for loop in loops]
        tv = lanes
    vectors = -(-tv // lanes)
    rows_max = max(1, min(MAX_ROWS, accumulators // vectors))
    u, tu = _rows(spatial, v, extents, rows_max)
    return loops, spatial, reduce, extents, v, tv, u, tu


def _rows(spatial: list[int], v: int, extents: list[int], rows_max: int) -> tuple[int | None, int]:
    """The spatial axis unrolled as accumulator rows, and how many: the axis and row count that waste
    the least of the tile (a ragged last tile computes nothing), preferring more rows and inner axes."""
    best, best_key = None, None
    for i in reversed(spatial):
        if i == v or extents[i] <= 1:
            continue
        for rows in range(min(rows_max, extents[i]), 0, -1):
            used = extents[i] / (-(-extents[i] // rows) * rows)
            key = (used >= 0.85, rows if used >= 0.85 else used)
            if best_key is None or key > best_key:
                best, best_key = (i, rows), key
    return best if best is not None else (None, 1)


def _is_output(sch, block) -> bool:
    func = sch.mod["main"]
    outputs = {p.name for p in func.params}
    return any(w.source.name in outputs for w in sch.get(block).writes)


def _vectorize_tile(sch, block, tv: int) -> None:
    """The epilogue or init block inside a tile: its innermost loop (the vector) vectorized."""
    loops = sch.get_loops(block)
    inner = loops[-1]
    extent = _extent(sch, inner)
    if extent == tv:
        sch.vectorize(inner)
    elif extent and extent % tv == 0:
        _, vec = sch.split(inner, factors=[None, tv])
        sch.vectorize(vec)


class RowReduction(dl.cpu.Reduction):
    """dlight's CPU softmax / norm rule, where it is right: reductions over more than one row (over a single
    row it parallelizes the last block's columns and recomputes every reduction in each: quadratic)."""

    def apply(self, func, target, tunable):
        sch = s_tir.Schedule(func)
        for block in _blocks(sch):
            iters = list(sch.get(block).iter_vars)
            extents = [_const(iv.dom.extent) for iv in iters[: _leading_spatial(iters)]]
            if not _is_spatial(sch, block) and (None in extents or math.prod(extents) < 2):
                return None
        return super().apply(func, target, tunable)


def _leading_spatial(iters) -> int:
    """How many of a block's iter vars come before its first reduction var."""
    return next((i for i, iv in enumerate(iters) if int(iv.iter_type) != 0), len(iters))


def _const(expr) -> int | None:
    return int(expr) if isinstance(expr, tirx.IntImm) else None


class Injective(CPUScheduleRule):
    """Element-wise / layout chains: inlined into the outputs; each output block parallel outside, vector inside."""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        blocks = _blocks(sch)
        if not blocks or not all(_is_spatial(sch, b) for b in blocks):
            return None
        _try_inline(sch, blocks[:-1])
        lanes = vector_lanes(target)
        for block in _blocks(sch):
            _vectorize_spatial(sch, block, lanes)
        return sch


class Fallback(CPUScheduleRule):
    """Each block: outer spatial loops fused and parallel (reduction loops stay inside, serial)."""

    def apply(self, func, target, _tunable):
        if not self.is_target_available(target):
            return None
        sch = s_tir.Schedule(func)
        lanes = vector_lanes(target)
        _try_inline(sch, [b for b in _blocks(sch)[:-1] if _is_spatial(sch, b)])
        for block in _blocks(sch):
            if _is_spatial(sch, block):
                _vectorize_spatial(sch, block, lanes)
                continue
            loops = sch.get_loops(block)
            iters = list(sch.get(block).iter_vars)
            lead = loops[: _leading_spatial(iters)]
            extents = [_extent(sch, loop) for loop in lead]
            if len(loops) != len(iters) or not lead or None in extents:
                continue
            total = math.prod(extents)
            if total >= 2 and total * max(1, len(loops) - len(lead)) >= MIN_PARALLEL_WORK // 4:
                sch.parallel(sch.fuse(*lead) if len(lead) > 1 else lead[0])
        return sch
