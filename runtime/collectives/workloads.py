"""Training workloads for the collectives simulator: models, DDP buckets, per-step timelines, job draws.

A model is its parameter tensors, named by block, in forward order, worked out from the public
Hugging Face architectures (OPTForCausalLM, BertForMaskedLM, ViTForImageClassification): parameter
counts match the released checkpoints exactly (OPT-125M 125,239,296, BERT-base 109,514,298, ...).
DDP buckets them as PyTorch does once it has rebuilt its buckets after the first step: tensors in the
order their gradients become ready (reverse forward order), the first bucket closed once it holds
1 MiB, the others at 25 MiB, fp32 gradients (4 bytes a parameter). MINA's measured traces have exactly
these bucket sizes.

Compute time is a model, not a measurement: a block's (a layer's, the head's, the embeddings') forward
time is its FLOPs over a matmul throughput that saturates with the rows of the batch (rows / (rows +
half_rows) of the peak) plus a fixed cost (kernel launches weigh at batch size 4); backward takes a
fixed multiple of forward, block by block in reverse; an optimizer tail grows with the parameter count.
`Gpu` holds the six constants, fitted by least squares to MINA's seven traces (their GPU, batch size 4):
step compute times land within 6% of theirs, first and last bucket ready times within 12%, and, as in
theirs, only OPT-125M's step gains from in-network aggregation at 100 Gb/s (4.0% here, 4.2% there).
A bucket's AllReduce is launched once backward has produced the gradients of all its tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import numpy as np

from tvmsched.errors import TvmschedError

MIB = 1 << 20
FIRST_BUCKET = 1 * MIB
BUCKET = 25 * MIB
GRAD_BYTES = 4  # fp32 gradients
STEP_COUNTS = tuple(range(10, 101, 10))  # MINA: 10, 20, ..., 100 training steps, uniform


@dataclass(frozen=True)
class Arch:
    """A transformer's shape (the fields Hugging Face's configs carry)."""

    family: str  # "opt" | "bert" | "vit"
    layers: int
    hidden: int
    ffn: int
    seq: int  # tokens per sample (ViT: patches + [CLS])
    vocab: int = 0
    positions: int = 0
    proj: int = 0  # OPT word_embed_proj_dim when it differs from hidden (OPT-350M)
    classes: int = 0  # ViT classifier outputs


ARCHS: dict[str, Arch] = {
    "opt-125m": Arch("opt", 12, 768, 3072, seq=512, vocab=50272, positions=2050),
    "opt-350m": Arch("opt", 24, 1024, 4096, seq=512, vocab=50272, positions=2050, proj=512),
    "opt-1.3b": Arch("opt", 24, 2048, 8192, seq=512, vocab=50272, positions=2050),
    "bert-base": Arch("bert", 12, 768, 3072, seq=512, vocab=30522, positions=512),
    "bert-large": Arch("bert", 24, 1024, 4096, seq=512, vocab=30522, positions=512),
    "vit-base": Arch("vit", 12, 768, 3072, seq=197, classes=1000),
    "vit-large": Arch("vit", 24, 1024, 4096, seq=197, classes=1000),
}
MODELS = tuple(ARCHS)  # MINA's batch-size-4 model list


@dataclass(frozen=True)
class Gpu:
    """The compute-time model's constants (fitted to MINA's traces; see the module docstring)."""

    flops: float = 51e12  # peak FLOP/s of the matmuls
    half_rows: int = 1500  # matmul rows (tokens in a batch) at which half the peak is reached
    block_s: float = 0.32e-3  # fixed forward cost of one block (a layer, the head, the embeddings)
    backward: float = 2.5  # backward time / forward time of a block
    tail_per_param_s: float = 4.2e-11  # optimizer step, per parameter
    tail_s: float = 6.8e-3  # fixed part of the step after backward
    speedup: float = 1.0  # divides every compute time (MINA's GPUSpeedupRatio)


@dataclass(frozen=True)
class Profile:
    """One training step of a model at batch size 4: compute, and its buckets' AllReduces in order.

    `starts[i]` is when bucket i's gradients are ready, relative to the step's start; `sync` is when
    the step's compute (forward, backward, optimizer) ends. A step ends at max(sync, last AllReduce end).
    """

    model: str
    params: int
    sizes: tuple[int, ...]  # bytes
    starts: tuple[float, ...]
    sync: float


def _linear(name: str, fan_in: int, fan_out: int, bias: bool = True) -> list[tuple[str, int]]:
    return [(f"{name}.weight", fan_in * fan_out)] + ([(f"{name}.bias", fan_out)] if bias else [])


def _norm(name: str, hidden: int) -> list[tuple[str, int]]:
    return [(f"{name}.weight", hidden), (f"{name}.bias", hidden)]


def _layer(arch: Arch, i: int) -> list[tuple[str, int]]:
    """One encoder/decoder layer's tensors in forward order, named `layer{i}.*`."""
    h, f, p = arch.hidden, arch.ffn, f"layer{i}"
    attn = [t for n in ("q", "k", "v", "out") for t in _linear(f"{p}.{n}", h, h)]
    mlp = _linear(f"{p}.fc1", h, f) + _linear(f"{p}.fc2", f, h)
    if arch.family == "bert" or arch.proj:  # post-norm: attention, norm, MLP, norm (BERT, OPT-350M)
        return attn + _norm(f"{p}.attn_norm", h) + mlp + _norm(f"{p}.norm", h)
    return _norm(f"{p}.attn_norm", h) + attn + _norm(f"{p}.norm", h) + mlp  # pre-norm (OPT, ViT)


def tensors(arch: Arch) -> list[tuple[str, int]]:
    """Every parameter tensor (name, numel) in the order the forward pass first uses it; a tied weight
    (OPT's lm_head, BERT's MLM decoder) is its embedding, whose gradient completes last in backward."""
    h, layers = arch.hidden, [t for i in range(arch.layers) for t in _layer(arch, i)]
    if arch.family == "opt":
        e = arch.proj or h
        embed = [("embed.tokens", arch.vocab * e), ("embed.positions", arch.positions * h)]
        if arch.proj:  # OPT-350M projects 512 <-> 1024 and normalises after each layer instead of at the end
            return embed + _linear("embed.project_in", e, h, False) + layers + _linear("head.project_out", h, e, False)
        return embed + layers + _norm("head.final_norm", h)
    if arch.family == "bert":
        embed = [("embed.words", arch.vocab * h), ("embed.positions", arch.positions * h), ("embed.types", 2 * h)]
        head = _linear("head.dense", h, h) + _norm("head.norm", h) + [("head.bias", arch.vocab)]
        return embed + _norm("embed.norm", h) + layers + head
    embed = _linear("embed.patch", 3 * 16 * 16, h) + [("embed.cls", h), ("embed.positions", arch.seq * h)]
    return embed + layers + _norm("head.norm", h) + _linear("head.classifier", h, arch.classes)


def buckets(numels: list[int]) -> list[list[int]]:
    """DDP's bucket assignment: indices into `numels` (forward order), in gradient-ready order (reverse,
    as DDP rebuilds its buckets after the first step), the first closed at 1 MiB, the others at 25 MiB."""
    out, cur, size = [], [], 0
    for i in reversed(range(len(numels))):
        cur.append(i)
        size += numels[i] * GRAD_BYTES
        if size >= (FIRST_BUCKET if not out else BUCKET):
            out.append(cur)
            cur, size = [], 0
    return out + ([cur] if cur else [])


def _block_flops(arch: Arch) -> dict[str, float]:
    """Forward FLOPs of each block for one batch of 4 samples (2 per multiply-add)."""
    tokens, h = 4 * arch.seq, arch.hidden
    layer = 2 * tokens * (4 * h * h + 2 * h * arch.ffn) + 4 * tokens * arch.seq * h  # matmuls + attention
    if arch.family == "vit":  # the classifier sees the [CLS] token only; the patch projection is a matmul
        head, embed = 2 * 4 * h * arch.classes, 2 * tokens * 3 * 16 * 16 * h
    elif arch.family == "opt":  # lm_head over every token
        head, embed = 2 * tokens * (arch.proj or h) * arch.vocab, 0.0
    else:  # the MLM transform, then the tied decoder over every token
        head, embed = 2 * tokens * h * (h + arch.vocab), 0.0
    return {"head": head, "embed": embed, **{f"layer{i}": layer for i in range(arch.layers)}}


@cache
def profile(model: str, gpu: Gpu = Gpu()) -> Profile:
    """The step profile of one of `MODELS` under a compute-time model."""
    if model not in ARCHS:
        raise TvmschedError(f"unknown model {model!r}; valid: {', '.join(MODELS)}")
    arch = ARCHS[model]
    ts = tensors(arch)
    flops = _block_flops(arch)
    rows = 4 * arch.seq
    rate = gpu.flops * rows / (rows + gpu.half_rows)
    fwd = {b: (f / rate + gpu.block_s) / gpu.speedup for b, f in flops.items()}
    forward = sum(fwd.values())
    order = ["head", *(f"layer{i}" for i in reversed(range(arch.layers))), "embed"]  # backward's order
    done, t = {}, forward
    for b in order:
        t += gpu.backward * fwd[b]
        done[b] = t
    backward_end = t
    params = sum(n for _, n in ts)
    ready = [done[_block_of(name)] for name, _ in ts]
    groups = buckets([n for _, n in ts])
    sizes = tuple(sum(ts[i][1] for i in g) * GRAD_BYTES for g in groups)
    starts = tuple(max(ready[i] for i in g) for g in groups)
    sync = backward_end + (params * gpu.tail_per_param_s + gpu.tail_s) / gpu.speedup
    return Profile(model, params, sizes, starts, sync)


def _block_of(name: str) -> str:
    return name.split(".", 1)[0]


def parameter_count(model: str) -> int:
    """Parameters of `model` (the released checkpoint's count)."""
    return sum(n for _, n in tensors(ARCHS[model]))


@dataclass(frozen=True)
class JobDraw:
    """One job of a cluster workload: model, host count, steps, in arrival order."""

    model: str
    hosts: int
    steps: int


def draw_jobs(trace: list[list[int]], count: int, seed: int, *, models: tuple[str, ...] = MODELS,
              host_scale: int = 1) -> list[JobDraw]:
    """`count` jobs as MINA draws them: model and step count uniform, host count by the trace's weights
    (times `host_scale`, the comm-heavy preset's wider jobs). Seeded with numpy's default generator."""
    rng = np.random.default_rng(seed)
    hosts = np.array([h * host_scale for h, _ in trace])
    weights = np.array([w for _, w in trace], dtype=float)
    m = rng.integers(0, len(models), count)
    h = rng.choice(hosts, size=count, p=weights / weights.sum())
    s = rng.integers(0, len(STEP_COUNTS), count)
    return [JobDraw(models[a], int(b), STEP_COUNTS[c]) for a, b, c in zip(m, h, s)]


def step_time(p: Profile, durations: list[float]) -> float:
    """The step's duration when AllReduce i takes durations[i] (one collective in flight at a time)."""
    t = 0.0
    for start, d in zip(p.starts, durations):
        t = max(t, start) + d
    return max(t, p.sync)


LATENCY_S = 50e-6  # MINA's per-AllReduce latency (the simulator's, the emulated links' and the switch's)


def transfer_s(size: int, hosts: int, bandwidth: float, latency: float, speedup: float = 1.0) -> float:
    """MINA's AllReduce time: latency + size / (bandwidth x speedup) (ring: 1, SHARP in-network: 2);
    a single host pays only the latency."""
    if hosts <= 1:
        return latency
    return latency + size / (bandwidth * speedup)


def check_positive(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise TvmschedError(f"{name} must be a positive number, got {value!r}")
