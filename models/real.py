"""Real architectures for tests and benchmarks: what users export, not what the zoo hand-builds.

Two sources, every weight seeded (the same name and seed give the same model):

* the onnx package's ``light`` models (ResNet-50, DenseNet-121, Inception v1/v2, VGG-19, SqueezeNet,
  ShuffleNet, AlexNet, ZFNet-512: opset 9 Caffe2 exports whose weights were stripped to
  ``ConstantOfShape`` nodes), their weights filled with seeded values scaled by role (He-normal
  convolutions, near-identity batch norms, small gammas on the batch norms that feed a residual sum);
* faithful ``torch.nn`` definitions (EfficientNet-B0, MobileNetV2, ConvNeXt-T, Swin-T, BERT-base,
  DistilBERT, GPT-2, T5-small, a small Llama) exported with the TorchScript exporter (``dynamo=False``)
  with dynamic batch / sequence / image axes, the way most real exports look: their shape arithmetic
  (Shape, Gather, Concat, Range, dynamic Pad / Reshape / Expand) is in the graph.

PyTorch exports take seconds to minutes, so built models are cached on disk under
``$TVMSCHED_MODEL_CACHE`` (default ``~/.cache/tvmsched/models``), keyed by the name, the seed and a
digest of this file and the torch / onnx versions.

Example:
    >>> from tvmsched import models
    >>> spec = models.REAL_MODELS["bert-base"]
    >>> model = models.build_real("bert-base", seed=0)   # dynamic axes: compile with spec.input_shapes
    >>> feeds = models.real_inputs("bert-base", seed=0)
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["REAL_MODELS", "RealInput", "RealModelSpec", "build_real", "cache_dir", "real_inputs", "real_model_path"]

TORCH_OPSET = 17


@dataclass(frozen=True)
class RealInput:
    """One graph input: the static shape it is compiled and run with, its dtype and value range.

    ``high`` (integer inputs): values lie in [0, high); ``mask``: a 0/1 attention mask whose last
    quarter of positions in every row but the first is padding (0).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    high: int | None = None
    mask: bool = False


@dataclass(frozen=True)
class RealModelSpec:
    """A real architecture.

    Attributes:
        name: registry name.
        description: one line: what it is and how it differs from the published model, if at all.
        source: "onnx-light" (an onnx package light model, seeded weights) or "pytorch" (a TorchScript export).
        inputs: the graph inputs with the static shapes to compile with.
        dynamic: names of the dynamic axes of the export (empty: the model is fully static).
    """

    name: str
    description: str
    source: str
    builder: Callable[[int], onnx.ModelProto] = field(repr=False)
    inputs: tuple[RealInput, ...]
    dynamic: tuple[str, ...] = ()

    @property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """`compile_model(..., input_shapes=...)` / `tvmsched compile --input-shape` values."""
        return {value.name: value.shape for value in self.inputs}

    def input_shape_options(self) -> str:
        return " ".join(f"--input-shape {v.name}={','.join(map(str, v.shape))}" for v in self.inputs)


# ---------------------------------------------------------------------------------------------
# cache


def cache_dir() -> Path:
    """Where built real models are cached: $TVMSCHED_MODEL_CACHE or ~/.cache/tvmsched/models."""
    return Path(os.environ.get("TVMSCHED_MODEL_CACHE") or Path.home() / ".cache" / "tvmsched" / "models")


@cache
def _digest() -> str:
    """Changes whenever this file or the exporting libraries change (a stale cache is never used)."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(onnx.__version__.encode())
    if torch is not None:
        h.update(torch.__version__.encode())
    return h.hexdigest()[:12]


def real_model_path(name: str, seed: int = 0, cache: Path | str | None = None) -> Path:
    """The cached ONNX file of a real model, built first when missing (atomically: parallel test
    workers may build the same model at once)."""
    spec = _lookup(name)
    folder = Path(cache) if cache is not None else cache_dir()
    path = folder / f"{name}-seed{seed}-{_digest()}.onnx"
    if not path.is_file():
        if torch is None:
            from tvmsched.extras import require

            require("models", f"building the real architecture {name}")
        model = spec.builder(seed)
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".onnx", dir=folder)
        os.close(fd)
        try:
            onnx.save_model(model, tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        for stale in folder.glob(f"{name}-seed{seed}-*.onnx"):  # built by an older version of this file
            if stale != path:
                stale.unlink(missing_ok=True)
    return path


def build_real(name: str, seed: int = 0, cache: Path | str | None = None) -> onnx.ModelProto:
    """A real model (from the on-disk cache when built before)."""
    return onnx.load(str(real_model_path(name, seed, cache)))


def real_inputs(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds of the shapes the model is compiled with (images N(0, 1), ids in range, masks)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in _lookup(name).inputs:
        if value.mask:
            mask = np.ones(value.shape, dtype=value.dtype)
            mask[1:, ..., value.shape[-1] * 3 // 4:] = 0
            if value.shape[0] == 1:
                mask[..., value.shape[-1] * 7 // 8:] = 0
            feeds[value.name] = mask
        elif value.high is not None:
            feeds[value.name] = rng.integers(0, value.high, value.shape).astype(value.dtype)
        else:
            feeds[value.name] = rng.standard_normal(value.shape).astype(value.dtype)
    return feeds


def _lookup(name: str) -> RealModelSpec:
    try:
        return REAL_MODELS[name]
    except KeyError:
        from . import UnknownModelError

        raise UnknownModelError(f"unknown real model {name!r}; valid names: {', '.join(REAL_MODELS)}") from None


# ---------------------------------------------------------------------------------------------
# onnx light models with seeded weights


def _light_path(name: str) -> Path:
    import onnx.backend.test

    return Path(onnx.backend.test.__file__).parent / "data" / "light" / f"light_{name}.onnx"


def _light_builder(name: str) -> Callable[[int], onnx.ModelProto]:
    def build(seed: int) -> onnx.ModelProto:
        return fill_light_weights(onnx.load(str(_light_path(name))), seed)

    return build


def fill_light_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Replace a light model's stripped weights (``ConstantOfShape`` of a shape initializer) and its
    float parameters by seeded values chosen by how each is used; everything else is kept.

    The result is IR 7 (initializers are no longer listed as graph inputs), opset unchanged.
    """
    rng = np.random.default_rng(seed)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    stripped = {n.output[0]: tuple(int(d) for d in numpy_helper.to_array(inits[n.input[0]]))
                for n in graph.node if n.op_type == "ConstantOfShape" and n.input[0] in inits}
    params = dict(stripped)
    params.update((t.name, tuple(t.dims)) for t in graph.initializer
                  if t.data_type == onnx.TensorProto.FLOAT and not t.name.endswith("__SHAPE"))
    consumers: dict[str, list] = {}
    for node in graph.node:
        for index, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, index))
    producers = {out: node for node in graph.node for out in node.output}

    def use(name: str) -> tuple[str, int, onnx.NodeProto | None]:
        """(op, input index, node) of the parameter's first real consumer (through Unsqueeze / Reshape)."""
        node, index = consumers.get(name, [(None, -1)])[0]
        while node is not None and node.op_type in ("Unsqueeze", "Reshape") and index == 0:
            node, index = consumers.get(node.output[0], [(None, -1)])[0]
        return (node.op_type if node is not None else "", index, node)

    def feeds_residual_sum(bn: onnx.NodeProto) -> bool:
        """Its output is added to an identity shortcut (a Sum / Add whose other operand is no batch norm's)."""
        return any(c.op_type in ("Sum", "Add") and len(c.input) > 1 and any(
            i in producers and producers[i].op_type != "BatchNormalization" for i in c.input)
            for c, _ in consumers.get(bn.output[0], []))

    values = {}
    for name in sorted(params):
        shape = params[name]
        op, index, node = use(name)
        size = int(np.prod(shape)) if shape else 1
        if op == "Conv" and index == 1:
            fan_in = int(np.prod(shape[1:]))
            value = rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
        elif op == "Gemm" and index == 1:
            trans_b = any(a.name == "transB" and a.i for a in node.attribute)
            fan_in = shape[1] if trans_b else shape[0]
            value = rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
        elif op == "BatchNormalization":
            if index == 1:  # gamma: small where the output is added to a residual (the stream stays O(1))
                value = rng.uniform(0.1, 0.3, shape) if feeds_residual_sum(node) else rng.uniform(0.8, 1.2, shape)
            elif index == 4:  # variance
                value = rng.uniform(0.8, 1.2, shape)
            else:  # beta, mean
                value = rng.normal(0.0, 0.05, shape)
        elif op == "Mul":  # per-channel affine scale after a batch norm (DenseNet, Inception v2)
            value = rng.uniform(0.8, 1.2, shape)
        else:  # biases (Conv, Gemm, Add) and anything else
            value = rng.normal(0.0, 0.05, shape) if size else np.zeros(shape)
        values[name] = value.astype(np.float32)

    nodes = [n for n in graph.node if not (n.op_type == "ConstantOfShape" and n.output[0] in stripped)]
    used = {name for n in nodes for name in n.input} | {o.name for o in graph.output}
    initializers = [numpy_helper.from_array(values[name], name) for name in sorted(values) if name in used]
    initializers += [t for t in graph.initializer if t.name not in values and t.name in used]
    filled = onnx.ModelProto()
    filled.CopyFrom(model)
    filled.ir_version = 7
    g = filled.graph
    del g.node[:], g.initializer[:], g.value_info[:]
    g.node.extend(nodes)
    g.initializer.extend(initializers)
    real = [v for v in model.graph.input if v.name not in inits and v.name not in stripped]
    del g.input[:]
    g.input.extend(real)
    onnx.checker.check_model(filled)
    return _calibrate_logits(filled, seed)


def _calibrate_logits(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """Scale the Gemm that feeds a final Softmax so that its logits have a standard deviation near 2 on a
    random image (a power of two: the same on every machine): a softmax neither uniform nor one-hot.

    Needs onnxruntime (a development dependency) to run the model once.
    """
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    softmax = next((n for n in graph.node if n.op_type == "Softmax" and n.output[0] in {o.name for o in graph.output}), None)
    gemm = producers.get(softmax.input[0]) if softmax is not None else None
    if gemm is None or gemm.op_type != "Gemm":
        return model
    try:
        import onnxruntime
    except ImportError:
        raise RuntimeError("building the light models needs onnxruntime to calibrate their logits "
                           "(pip install onnxruntime)") from None
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.output[:]
    probe.graph.output.extend([helper.make_empty_tensor_value_info(gemm.output[0])])
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed + 1)
    feeds = {v.name: rng.standard_normal([d.dim_value for d in v.type.tensor_type.shape.dim]).astype(np.float32)
             for v in graph.input}
    std = float(np.std(session.run(None, feeds)[0]))
    scale = np.float32(2.0 ** round(math.log2(2.0 / std))) if std > 0 and math.isfinite(std) else np.float32(1)
    inits = {t.name: t for t in graph.initializer}
    for name in gemm.input[1:3]:
        while name not in inits and name in producers and producers[name].op_type == "Reshape":
            name = producers[name].input[0]  # a weight stored 4-D (Inception v1)
        if name in inits:
            inits[name].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[name]) * scale, name))
    return model


# ---------------------------------------------------------------------------------------------
# PyTorch exports


def _export(module, args: tuple, input_names: list[str], output_names: list[str],
            dynamic_axes: dict[str, dict[int, str]]) -> onnx.ModelProto:
    """TorchScript-based export (dynamo=False: the dynamo exporter needs onnxscript) with dynamic axes,
    opset 17, constants folded by torch."""
    module.eval()
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        path = os.path.join(tmp, "model.onnx")
        torch.onnx.export(module, args, path, dynamo=False, opset_version=TORCH_OPSET, input_names=input_names,
                          output_names=output_names, dynamic_axes=dynamic_axes, do_constant_folding=True)
        model = onnx.load(path)
    model.producer_name = f"tvmsched.models.real (torch {torch.__version__}, TorchScript exporter)"
    return model


def _seeded(seed: int):
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def _init_weights(module, rng: np.random.Generator, *, gain: float = 1.0, embed_std: float = 1.0) -> None:
    """Seeded weights whose activations stay O(1): Linear / Conv N(0, gain^2 / fan_in), biases and norm
    shifts N(0, 0.05^2), norm scales U(0.8, 1.2), batch-norm statistics near (0, 1), embeddings N(0, embed_std^2).
    Parameters the modules own directly (layer scales, position tables) are set by the modules."""

    def put(param, value):
        param.data.copy_(torch.from_numpy(np.asarray(value, dtype=np.float32).reshape(param.shape)))

    for sub in module.modules():
        if isinstance(sub, (nn.Linear, nn.Conv2d)):
            fan_in = sub.weight[0].numel()
            put(sub.weight, rng.standard_normal(sub.weight.shape) * gain / math.sqrt(fan_in))
            if sub.bias is not None:
                put(sub.bias, rng.normal(0.0, 0.05, sub.bias.shape))
        elif isinstance(sub, nn.Embedding):
            put(sub.weight, rng.standard_normal(sub.weight.shape) * embed_std)
        elif isinstance(sub, (nn.LayerNorm, nn.BatchNorm2d, RMSNorm)):
            if sub.weight is not None:
                put(sub.weight, rng.uniform(0.8, 1.2, sub.weight.shape))
            if getattr(sub, "bias", None) is not None:
                put(sub.bias, rng.normal(0.0, 0.05, sub.bias.shape))
            if isinstance(sub, nn.BatchNorm2d):
                put(sub.running_mean, rng.normal(0.0, 0.05, sub.running_mean.shape))
                put(sub.running_var, rng.uniform(0.8, 1.2, sub.running_var.shape))


try:  # the module classes need torch to be defined; the light models and the registry do not
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError:  # without tvmsched's `models` extra: building one is an error line naming it
    torch = None


if torch is not None:
    # ---- convolutional networks -------------------------------------------------------------

    class SameConv2d(nn.Conv2d):
        """TF "SAME" padding computed from the input size at run time (EfficientNet-PyTorch's
        Conv2dDynamicSamePadding; TF-ported MobileNets): a dynamic Pad in a dynamic-axes export."""

        def forward(self, x):
            ih, iw = x.size()[-2:]
            (kh, kw), (sh, sw), (dh, dw) = self.kernel_size, self.stride, self.dilation
            oh, ow = (ih + sh - 1) // sh, (iw + sw - 1) // sw
            pad_h, pad_w = (oh - 1) * sh + (kh - 1) * dh + 1 - ih, (ow - 1) * sw + (kw - 1) * dw + 1 - iw
            if torch.jit.is_tracing():  # sizes are 0-d tensors: the pads stay computed from the input's shape
                pad_h, pad_w = torch.clamp(pad_h, min=0), torch.clamp(pad_w, min=0)
            else:
                pad_h, pad_w = max(pad_h, 0), max(pad_w, 0)
            x = F.pad(x, [pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2])
            return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    class ConvBNAct(nn.Sequential):
        def __init__(self, cin, cout, kernel, stride=1, groups=1, act=nn.SiLU, eps=1e-3, same=True):
            conv = (SameConv2d(cin, cout, kernel, stride, groups=groups, bias=False) if same
                    else nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False))
            layers = [conv, nn.BatchNorm2d(cout, eps=eps)]
            if act is not None:
                layers.append(act())
            super().__init__(*layers)

    class SqueezeExcite(nn.Module):
        def __init__(self, channels, reduced, act=F.silu):
            super().__init__()
            self.reduce = nn.Conv2d(channels, reduced, 1)
            self.expand = nn.Conv2d(reduced, channels, 1)
            self.act = act

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * torch.sigmoid(self.expand(self.act(self.reduce(s))))

    class MBConv(nn.Module):
        """EfficientNet's mobile inverted bottleneck: expand, depthwise, squeeze-excite, project."""

        def __init__(self, cin, cout, kernel, stride, expand):
            super().__init__()
            mid = cin * expand
            self.expand = ConvBNAct(cin, mid, 1) if expand != 1 else nn.Identity()
            self.depthwise = ConvBNAct(mid, mid, kernel, stride, groups=mid)
            self.se = SqueezeExcite(mid, max(1, cin // 4))
            self.project = ConvBNAct(mid, cout, 1, act=None)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.project(self.se(self.depthwise(self.expand(x))))
            return x + y if self.residual else y

    class EfficientNetB0(nn.Module):
        # (expand ratio, kernel, stride, in, out, repeats): the published B0 table
        STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                  (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))

        def __init__(self, classes=1000):
            super().__init__()
            self.stem = ConvBNAct(3, 32, 3, 2)
            blocks = []
            for expand, kernel, stride, cin, cout, repeats in self.STAGES:
                for i in range(repeats):
                    blocks.append(MBConv(cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand))
            self.blocks = nn.Sequential(*blocks)
            self.head = ConvBNAct(320, 1280, 1)
            self.fc = nn.Linear(1280, classes)

        def forward(self, x):
            x = self.head(self.blocks(self.stem(x)))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class InvertedResidual(nn.Module):
        def __init__(self, cin, cout, stride, expand):
            super().__init__()
            mid = cin * expand
            layers = [ConvBNAct(cin, mid, 1, act=nn.ReLU6, eps=1e-5)] if expand != 1 else []
            layers += [ConvBNAct(mid, mid, 3, stride, groups=mid, act=nn.ReLU6, eps=1e-5),
                       ConvBNAct(mid, cout, 1, act=None, eps=1e-5)]
            self.conv = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.conv(x) if self.residual else self.conv(x)

    class MobileNetV2(nn.Module):
        # (expansion t, channels c, repeats n, stride s): the published table, width 1.0
        STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                  (6, 320, 1, 1))

        def __init__(self, classes=1000):
            super().__init__()
            layers, cin = [ConvBNAct(3, 32, 3, 2, act=nn.ReLU6, eps=1e-5)], 32
            for t, c, n, s in self.STAGES:
                for i in range(n):
                    layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                    cin = c
            layers.append(ConvBNAct(cin, 1280, 1, act=nn.ReLU6, eps=1e-5))
            self.features = nn.Sequential(*layers)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):
            x = F.adaptive_avg_pool2d(self.features(x), 1)
            return self.classifier(torch.flatten(x, 1))

    class RegNetBlock(nn.Module):
        """RegNetY's residual bottleneck (ratio 1): 1x1, grouped 3x3 of a fixed group width, squeeze-excite, 1x1."""

        def __init__(self, cin, cout, stride, group_width):
            super().__init__()
            bn = dict(eps=1e-5, same=False)
            self.a = ConvBNAct(cin, cout, 1, act=nn.ReLU, **bn)
            self.b = ConvBNAct(cout, cout, 3, stride, groups=cout // group_width, act=nn.ReLU, **bn)
            self.se = SqueezeExcite(cout, max(1, round(0.25 * cin)), act=F.relu)
            self.c = ConvBNAct(cout, cout, 1, act=None, **bn)
            self.shortcut = ConvBNAct(cin, cout, 1, stride, act=None, **bn) if stride != 1 or cin != cout else nn.Identity()

        def forward(self, x):
            return F.relu(self.c(self.se(self.b(self.a(x)))) + self.shortcut(x))

    class RegNetY400MF(nn.Module):
        # (depth, width) per stage, group width 8: the published RegNetY-400MF
        STAGES = ((1, 48), (3, 104), (6, 208), (6, 440))

        def __init__(self, classes=1000, group_width=8):
            super().__init__()
            blocks, cin = [ConvBNAct(3, 32, 3, 2, act=nn.ReLU, eps=1e-5, same=False)], 32
            for depth, width in self.STAGES:
                for i in range(depth):
                    blocks.append(RegNetBlock(cin, width, 2 if i == 0 else 1, group_width))
                    cin = width
            self.trunk = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.trunk(x), 1), 1))

    class LayerNorm2d(nn.Module):
        """ConvNeXt's channels-first LayerNorm, written out (mean / pow / sqrt) as in the reference code."""

        def __init__(self, channels, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(channels))
            self.bias = nn.Parameter(torch.zeros(channels))
            self.eps = eps

        def forward(self, x):
            u = x.mean(1, keepdim=True)
            s = (x - u).pow(2).mean(1, keepdim=True)
            x = (x - u) / torch.sqrt(s + self.eps)
            return self.weight[:, None, None] * x + self.bias[:, None, None]

    class ConvNeXtBlock(nn.Module):
        def __init__(self, dim, rng):
            super().__init__()
            self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
            self.norm = nn.LayerNorm(dim, eps=1e-6)
            self.pwconv1 = nn.Linear(dim, 4 * dim)
            self.pwconv2 = nn.Linear(4 * dim, dim)
            self.gamma = nn.Parameter(torch.from_numpy(rng.uniform(0.1, 0.3, dim).astype(np.float32)))

        def forward(self, x):
            y = self.dwconv(x).permute(0, 2, 3, 1)
            y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
            return x + (self.gamma * y).permute(0, 3, 1, 2)

    class ConvNeXt(nn.Module):
        def __init__(self, rng, depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), classes=1000):
            super().__init__()
            self.downsample = nn.ModuleList([nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0]))])
            for i in range(3):
                self.downsample.append(nn.Sequential(LayerNorm2d(dims[i]), nn.Conv2d(dims[i], dims[i + 1], 2, 2)))
            self.stages = nn.ModuleList(nn.Sequential(*[ConvNeXtBlock(d, rng) for _ in range(n)])
                                        for n, d in zip(depths, dims))
            self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
            self.head = nn.Linear(dims[-1], classes)

        def forward(self, x):
            for down, stage in zip(self.downsample, self.stages):
                x = stage(down(x))
            return self.head(self.norm(x.mean([-2, -1])))

    # ---- Swin Transformer -------------------------------------------------------------------

    def window_partition(x, window):
        B, H, W, C = x.shape
        x = x.view(B, H // window, window, W // window, window, C)
        return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window, window, C)

    def window_reverse(windows, window, H, W):
        B = int(windows.shape[0] / (H * W / window / window))
        x = windows.view(B, H // window, W // window, window, window, -1)
        return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)

    class WindowAttention(nn.Module):
        def __init__(self, dim, window, heads, rng):
            super().__init__()
            self.window, self.heads = window, heads
            self.scale = (dim // heads) ** -0.5
            table = rng.normal(0.0, 0.5, ((2 * window - 1) ** 2, heads)).astype(np.float32)
            self.relative_position_bias_table = nn.Parameter(torch.from_numpy(table))
            coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij"))
            flat = torch.flatten(coords, 1)
            rel = (flat[:, :, None] - flat[:, None, :]).permute(1, 2, 0).contiguous()
            rel[:, :, 0] += window - 1
            rel[:, :, 1] += window - 1
            rel[:, :, 0] *= 2 * window - 1
            self.register_buffer("relative_position_index", rel.sum(-1))
            self.qkv = nn.Linear(dim, dim * 3)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x, mask=None):
            B_, N, C = x.shape
            qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            attn = (q * self.scale) @ k.transpose(-2, -1)
            bias = self.relative_position_bias_table[self.relative_position_index.view(-1)]
            attn = attn + bias.view(N, N, -1).permute(2, 0, 1).contiguous().unsqueeze(0)
            if mask is not None:
                nW = mask.shape[0]
                attn = attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
                attn = attn.view(-1, self.heads, N, N)
            x = (attn.softmax(-1) @ v).transpose(1, 2).reshape(B_, N, C)
            return self.proj(x)

    class SwinBlock(nn.Module):
        def __init__(self, dim, resolution, heads, window, shift, rng):
            super().__init__()
            self.resolution = resolution
            if resolution <= window:
                window, shift = resolution, 0
            self.window, self.shift = window, shift
            self.norm1 = nn.LayerNorm(dim)
            self.attn = WindowAttention(dim, window, heads, rng)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            mask = None
            if shift:
                img = torch.zeros((1, resolution, resolution, 1))
                cnt = 0
                for h in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                    for w in (slice(0, -window), slice(-window, -shift), slice(-shift, None)):
                        img[:, h, w, :] = cnt
                        cnt += 1
                windows = window_partition(img, window).view(-1, window * window)
                mask = windows.unsqueeze(1) - windows.unsqueeze(2)
                mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
            self.register_buffer("attn_mask", mask)

        def forward(self, x):
            H = W = self.resolution
            B, L, C = x.shape
            shortcut = x
            x = self.norm1(x).view(B, H, W, C)
            if self.shift:
                x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
            windows = window_partition(x, self.window).view(-1, self.window * self.window, C)
            windows = self.attn(windows, mask=self.attn_mask).view(-1, self.window, self.window, C)
            x = window_reverse(windows, self.window, H, W)
            if self.shift:
                x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
            x = shortcut + x.view(B, H * W, C)
            return x + self.mlp(self.norm2(x))

    class PatchMerging(nn.Module):
        def __init__(self, resolution, dim):
            super().__init__()
            self.resolution = resolution
            self.norm = nn.LayerNorm(4 * dim)
            self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)

        def forward(self, x):
            H = W = self.resolution
            B, L, C = x.shape
            x = x.view(B, H, W, C)
            x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
            return self.reduction(self.norm(x.view(B, -1, 4 * C)))

    class SwinTransformer(nn.Module):
        def __init__(self, rng, image=224, depths=(2, 2, 6, 2), heads=(3, 6, 12, 24), dim=96, window=7, classes=1000):
            super().__init__()
            self.patch_embed = nn.Conv2d(3, dim, 4, 4)
            self.patch_norm = nn.LayerNorm(dim)
            layers, resolution = [], image // 4
            for i, (depth, h) in enumerate(zip(depths, heads)):
                d = dim * 2**i
                for j in range(depth):
                    layers.append(SwinBlock(d, resolution, h, window, 0 if j % 2 == 0 else window // 2, rng))
                if i < len(depths) - 1:
                    layers.append(PatchMerging(resolution, d))
                    resolution //= 2
            self.layers = nn.Sequential(*layers)
            self.norm = nn.LayerNorm(dim * 2 ** (len(depths) - 1))
            self.head = nn.Linear(dim * 2 ** (len(depths) - 1), classes)

        def forward(self, x):
            x = self.patch_norm(self.patch_embed(x).flatten(2).transpose(1, 2))
            x = self.norm(self.layers(x))
            return self.head(torch.flatten(x.transpose(1, 2).mean(-1, keepdim=True), 1))

    # ---- transformers -----------------------------------------------------------------------

    class BertSelfAttention(nn.Module):
        def __init__(self, hidden, heads):
            super().__init__()
            self.heads, self.head_dim = heads, hidden // heads
            self.query, self.key, self.value = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

        def split(self, x):  # HF's transpose_for_scores
            return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

        def forward(self, x, mask):
            q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + mask
            context = torch.matmul(F.softmax(scores, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            return context.view(context.size()[:-2] + (self.heads * self.head_dim,))

    class BertLayer(nn.Module):
        def __init__(self, hidden, heads, ffn):
            super().__init__()
            self.attention = BertSelfAttention(hidden, heads)
            self.attention_output = nn.Linear(hidden, hidden)
            self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.intermediate = nn.Linear(hidden, ffn)
            self.output = nn.Linear(ffn, hidden)
            self.output_norm = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x, mask):
            x = self.attention_norm(x + self.attention_output(self.attention(x, mask)))
            return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))

    class Bert(nn.Module):
        """BERT (HF BertModel's structure): embeddings + LayerNorm, post-LN encoder layers, pooler."""

        def __init__(self, vocab=30522, hidden=768, layers=12, heads=12, ffn=3072, positions=512):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, hidden)
            self.position_embeddings = nn.Embedding(positions, hidden)
            self.token_type_embeddings = nn.Embedding(2, hidden)
            self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.register_buffer("position_ids", torch.arange(positions).expand((1, -1)), persistent=False)
            self.layers = nn.ModuleList(BertLayer(hidden, heads, ffn) for _ in range(layers))
            self.pooler = nn.Linear(hidden, hidden)

        def forward(self, input_ids, attention_mask, token_type_ids):
            seq = input_ids.size(1)
            position_ids = self.position_ids[:, :seq]
            x = self.word_embeddings(input_ids) + self.position_embeddings(position_ids)
            x = self.embedding_norm(x + self.token_type_embeddings(token_type_ids))
            mask = attention_mask[:, None, None, :].to(x.dtype)
            mask = (1.0 - mask) * torch.finfo(x.dtype).min
            for layer in self.layers:
                x = layer(x, mask)
            return x, torch.tanh(self.pooler(x[:, 0]))

    class DistilBertLayer(nn.Module):
        def __init__(self, dim, heads, ffn):
            super().__init__()
            self.heads, self.dim = heads, dim
            self.q_lin, self.k_lin, self.v_lin, self.out_lin = (nn.Linear(dim, dim) for _ in range(4))
            self.sa_layer_norm = nn.LayerNorm(dim, eps=1e-12)
            self.lin1, self.lin2 = nn.Linear(dim, ffn), nn.Linear(ffn, dim)
            self.output_layer_norm = nn.LayerNorm(dim, eps=1e-12)

        def forward(self, x, mask):
            bs, q_len, dim = x.size()
            k_len = x.size(1)
            head_dim = self.dim // self.heads

            def shape(t):
                return t.view(bs, -1, self.heads, head_dim).transpose(1, 2)

            q = shape(self.q_lin(x)) / math.sqrt(head_dim)
            k, v = shape(self.k_lin(x)), shape(self.v_lin(x))
            scores = torch.matmul(q, k.transpose(2, 3))
            mask = (mask == 0).view(bs, 1, 1, k_len).expand_as(scores)
            scores = scores.masked_fill(mask, torch.tensor(torch.finfo(scores.dtype).min))
            context = torch.matmul(F.softmax(scores, dim=-1), v).transpose(1, 2).contiguous()
            context = context.view(bs, -1, self.heads * head_dim)
            x = self.sa_layer_norm(self.out_lin(context) + x)
            return self.output_layer_norm(self.lin2(F.gelu(self.lin1(x))) + x)

    class DistilBert(nn.Module):
        """DistilBERT (HF DistilBertModel's structure): positions from arange(seq), masked_fill attention."""

        def __init__(self, vocab=30522, dim=768, layers=6, heads=12, ffn=3072, positions=512):
            super().__init__()
            self.word_embeddings = nn.Embedding(vocab, dim)
            self.position_embeddings = nn.Embedding(positions, dim)
            self.norm = nn.LayerNorm(dim, eps=1e-12)
            self.layers = nn.ModuleList(DistilBertLayer(dim, heads, ffn) for _ in range(layers))

        def forward(self, input_ids, attention_mask):
            seq = input_ids.size(1)
            position_ids = torch.arange(seq, dtype=torch.long, device=input_ids.device).unsqueeze(0).expand_as(input_ids)
            x = self.norm(self.word_embeddings(input_ids) + self.position_embeddings(position_ids))
            for layer in self.layers:
                x = layer(x, attention_mask)
            return x

    class Conv1D(nn.Module):
        """GPT-2's transposed linear: addmm over a flattened input (a dynamic Reshape in the export)."""

        def __init__(self, nf, nx, rng):
            super().__init__()
            self.nf = nf
            self.weight = nn.Parameter(torch.from_numpy((rng.standard_normal((nx, nf)) / math.sqrt(nx)).astype(np.float32)))
            self.bias = nn.Parameter(torch.from_numpy(rng.normal(0.0, 0.05, nf).astype(np.float32)))

        def forward(self, x):
            size_out = x.size()[:-1] + (self.nf,)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)

    class GPT2Block(nn.Module):
        def __init__(self, dim, heads, positions, rng):
            super().__init__()
            self.heads, self.head_dim = heads, dim // heads
            self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.c_attn, self.c_proj = Conv1D(3 * dim, dim, rng), Conv1D(dim, dim, rng)
            self.c_fc, self.mlp_proj = Conv1D(4 * dim, dim, rng), Conv1D(dim, 4 * dim, rng)
            causal = torch.tril(torch.ones((positions, positions), dtype=torch.bool)).view(1, 1, positions, positions)
            self.register_buffer("bias", causal, persistent=False)

        def split_heads(self, x):
            return x.view(x.size()[:-1] + (self.heads, self.head_dim)).permute(0, 2, 1, 3)

        def forward(self, x):
            q, k, v = self.c_attn(self.ln_1(x)).split(self.heads * self.head_dim, dim=2)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
            w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], v.size(-1) ** 0.5, dtype=q.dtype)
            q_len, k_len = q.size(-2), k.size(-2)
            causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
            w = torch.where(causal, w, torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype))
            a = torch.matmul(F.softmax(w, dim=-1), v).permute(0, 2, 1, 3).contiguous()
            a = a.view(a.size()[:-2] + (self.heads * self.head_dim,))
            x = x + self.c_proj(a)
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        """GPT-2 (HF GPT2LMHeadModel's structure): learned positions, causal mask sliced from a buffer,
        Conv1D projections, tanh GELU, final LayerNorm, LM head tied to the token embedding."""

        def __init__(self, rng, vocab=50257, dim=768, layers=12, heads=12, positions=1024):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(positions, dim)
            self.h = nn.ModuleList(GPT2Block(dim, heads, positions, rng) for _ in range(layers))
            self.ln_f = nn.LayerNorm(dim)

        def forward(self, input_ids):
            seq = input_ids.size(-1)
            position_ids = torch.arange(0, seq, dtype=torch.long, device=input_ids.device).unsqueeze(0)
            x = self.wte(input_ids) + self.wpe(position_ids)
            for block in self.h:
                x = block(x)
            return torch.matmul(self.ln_f(x), self.wte.weight.t())

    class RMSNorm(nn.Module):
        """T5LayerNorm / LlamaRMSNorm: x * rsqrt(mean(x^2) + eps) * weight (no mean, no bias)."""

        def __init__(self, dim, eps=1e-6):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(dim))
            self.eps = eps

        def forward(self, x):
            variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(variance + self.eps))

    class T5Attention(nn.Module):
        def __init__(self, dim, heads, kv_dim, has_bias, bidirectional, buckets=32, max_distance=128):
            super().__init__()
            self.heads, self.kv_dim = heads, kv_dim
            self.q, self.k, self.v = (nn.Linear(dim, heads * kv_dim, bias=False) for _ in range(3))
            self.o = nn.Linear(heads * kv_dim, dim, bias=False)
            self.bidirectional, self.buckets, self.max_distance = bidirectional, buckets, max_distance
            self.relative_attention_bias = nn.Embedding(buckets, heads) if has_bias else None

        def bucket(self, relative):
            buckets, n = 0, self.buckets
            if self.bidirectional:
                n //= 2
                buckets += (relative > 0).to(torch.long) * n
                relative = torch.abs(relative)
            else:
                relative = -torch.min(relative, torch.zeros_like(relative))
            exact = n // 2
            large = exact + (torch.log(relative.float() / exact) / math.log(self.max_distance / exact)
                             * (n - exact)).to(torch.long)
            large = torch.min(large, torch.full_like(large, n - 1))
            return buckets + torch.where(relative < exact, relative, large)

        def position_bias(self, q_len, k_len, device):
            context = torch.arange(q_len, dtype=torch.long, device=device)[:, None]
            memory = torch.arange(k_len, dtype=torch.long, device=device)[None, :]
            values = self.relative_attention_bias(self.bucket(memory - context))
            return values.permute([2, 0, 1]).unsqueeze(0)

        def forward(self, x, mask, bias=None, kv=None):
            B, q_len = x.shape[:2]
            kv = x if kv is None else kv
            k_len = kv.shape[1]

            def shape(t):
                return t.view(B, -1, self.heads, self.kv_dim).transpose(1, 2)

            q, k, v = shape(self.q(x)), shape(self.k(kv)), shape(self.v(kv))
            scores = torch.matmul(q, k.transpose(3, 2))  # T5: no 1/sqrt(d) scaling
            if bias is None:
                bias = (self.position_bias(q_len, k_len, x.device) if self.relative_attention_bias is not None
                        else torch.zeros((1, self.heads, q_len, k_len), dtype=scores.dtype, device=x.device))
                bias = bias + mask
            w = F.softmax(scores.float() + bias, dim=-1).type_as(scores)
            out = torch.matmul(w, v).transpose(1, 2).contiguous().view(B, -1, self.heads * self.kv_dim)
            return self.o(out), bias

    class T5Block(nn.Module):
        def __init__(self, dim, heads, kv_dim, ffn, has_bias, decoder):
            super().__init__()
            self.self_norm = RMSNorm(dim)
            self.self_attn = T5Attention(dim, heads, kv_dim, has_bias, bidirectional=not decoder)
            self.cross_norm = RMSNorm(dim) if decoder else None
            self.cross_attn = T5Attention(dim, heads, kv_dim, False, True) if decoder else None
            self.ff_norm = RMSNorm(dim)
            self.wi, self.wo = nn.Linear(dim, ffn, bias=False), nn.Linear(ffn, dim, bias=False)

        def forward(self, x, mask, bias, memory=None, memory_mask=None, cross_bias=None):
            y, bias = self.self_attn(self.self_norm(x), mask, bias)
            x = x + y
            if self.cross_attn is not None:
                y, cross_bias = self.cross_attn(self.cross_norm(x), memory_mask, cross_bias, kv=memory)
                x = x + y
            return x + self.wo(F.relu(self.wi(self.ff_norm(x)))), bias, cross_bias

    class T5(nn.Module):
        """T5 (HF T5ForConditionalGeneration's structure, v1.0 small): shared embedding, RMS norms,
        bucketed relative position bias computed from the sequence lengths, ReLU FFN, tied LM head."""

        def __init__(self, vocab=32128, dim=512, layers=6, heads=8, kv_dim=64, ffn=2048):
            super().__init__()
            self.dim = dim
            self.shared = nn.Embedding(vocab, dim)
            self.encoder = nn.ModuleList(T5Block(dim, heads, kv_dim, ffn, i == 0, False) for i in range(layers))
            self.encoder_norm = RMSNorm(dim)
            self.decoder = nn.ModuleList(T5Block(dim, heads, kv_dim, ffn, i == 0, True) for i in range(layers))
            self.decoder_norm = RMSNorm(dim)

        def forward(self, input_ids, attention_mask, decoder_input_ids):
            minimum = torch.finfo(torch.float32).min
            enc_mask = (1.0 - attention_mask[:, None, None, :].to(torch.float32)) * minimum
            x, bias = self.shared(input_ids), None
            for block in self.encoder:
                x, bias, _ = block(x, enc_mask, bias)
            memory = self.encoder_norm(x)
            dec_len = decoder_input_ids.shape[1]
            seq = torch.arange(dec_len, device=decoder_input_ids.device)
            causal = (seq[None, None, :].repeat(1, dec_len, 1) <= seq[None, :, None]).to(torch.float32)
            dec_mask = (1.0 - causal[:, None, :, :]) * minimum
            y, bias, cross = self.shared(decoder_input_ids), None, None
            for block in self.decoder:
                y, bias, cross = block(y, dec_mask, bias, memory, enc_mask, cross)
            y = self.decoder_norm(y) * (self.dim ** -0.5)
            return torch.matmul(y, self.shared.weight.t())

    def rotate_half(x):
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    class LlamaAttention(nn.Module):
        def __init__(self, dim, heads, kv_heads):
            super().__init__()
            self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
            self.q_proj = nn.Linear(dim, heads * self.head_dim, bias=False)
            self.k_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.v_proj = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
            self.o_proj = nn.Linear(heads * self.head_dim, dim, bias=False)

        def repeat_kv(self, x):
            b, kv, s, d = x.shape
            n = self.heads // self.kv_heads
            return x[:, :, None, :, :].expand(b, kv, n, s, d).reshape(b, kv * n, s, d)

        def forward(self, x, cos, sin, mask):
            b, s, _ = x.size()
            q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = self.repeat_kv(k), self.repeat_kv(v)
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
            out = torch.matmul(F.softmax(w, dim=-1, dtype=torch.float32), v).transpose(1, 2).contiguous()
            return self.o_proj(out.reshape(b, s, -1))

    class LlamaLayer(nn.Module):
        def __init__(self, dim, heads, kv_heads, ffn):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(dim, 1e-5), RMSNorm(dim, 1e-5)
            self.self_attn = LlamaAttention(dim, heads, kv_heads)
            self.gate_proj, self.up_proj = nn.Linear(dim, ffn, bias=False), nn.Linear(dim, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, dim, bias=False)

        def forward(self, x, cos, sin, mask):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
            h = self.post_attention_layernorm(x)
            return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))

    class Llama(nn.Module):
        """A small Llama (HF LlamaForCausalLM's structure): RMSNorm, rotary embeddings from arange(seq),
        grouped-query attention, SwiGLU MLP, causal mask built with triu, untied LM head."""

        def __init__(self, vocab=32000, dim=512, layers=8, heads=8, kv_heads=4, ffn=1408, theta=10000.0):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, dim)
            self.layers = nn.ModuleList(LlamaLayer(dim, heads, kv_heads, ffn) for _ in range(layers))
            self.norm = RMSNorm(dim, 1e-5)
            self.lm_head = nn.Linear(dim, vocab, bias=False)
            head_dim = dim // heads
            inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)

        def forward(self, input_ids):
            b, s = input_ids.shape
            positions = torch.arange(s, device=input_ids.device, dtype=torch.float32)
            freqs = positions[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
            mask = torch.full((s, s), torch.finfo(torch.float32).min, device=input_ids.device).triu(1)[None, None]
            x = self.embed_tokens(input_ids)
            for layer in self.layers:
                x = layer(x, cos, sin, mask)
            return self.lm_head(self.norm(x))
else:  # pragma: no cover
    class RMSNorm:  # placeholder so _init_weights' isinstance check stays valid
        pass


def _image_export(make: Callable[[np.random.Generator], object], image: int = 224) -> Callable[[int], onnx.ModelProto]:
    def build(seed: int) -> onnx.ModelProto:
        rng = _seeded(seed)
        module = make(rng)
        _init_weights(module, rng, gain=math.sqrt(2.0))
        x = torch.from_numpy(rng.standard_normal((1, 3, image, image)).astype(np.float32))
        return _export(module, (x,), ["input"], ["logits"], {"input": {0: "batch", 2: "height", 3: "width"},
                                                            "logits": {0: "batch"}})

    return build


def _text_export(make: Callable[[np.random.Generator], object], inputs: list[str], outputs: list[str],
                 vocab: int, seq: int = 128, embed_std: float = 1.0) -> Callable[[int], onnx.ModelProto]:
    def build(seed: int) -> onnx.ModelProto:
        rng = _seeded(seed)
        module = make(rng)
        _init_weights(module, rng, embed_std=embed_std)
        for sub in module.modules():
            if type(sub).__name__ == "T5Attention":  # T5 has no 1/sqrt(d) in attention: its init scales q instead
                sub.q.weight.data.mul_(sub.kv_dim ** -0.5)
        args = []
        for name in inputs:
            if name in ("attention_mask",):
                args.append(torch.ones((1, seq), dtype=torch.long))
            elif name == "token_type_ids":
                args.append(torch.zeros((1, seq), dtype=torch.long))
            else:
                args.append(torch.from_numpy(rng.integers(0, vocab, (1, seq))))
        axes = {name: {0: "batch", 1: "decoder_sequence" if name.startswith("decoder") else "sequence"} for name in inputs}
        axes.update({name: {0: "batch"} for name in outputs})
        return _export(module, tuple(args), inputs, outputs, axes)

    return build


def _image_inputs(image: int = 224) -> tuple[RealInput, ...]:
    return (RealInput("input", (1, 3, image, image)),)


def _text_inputs(names: list[str], vocab: int, seq: int = 128, batch: int = 1) -> tuple[RealInput, ...]:
    values = []
    for name in names:
        if name == "attention_mask":
            values.append(RealInput(name, (batch, seq), "int64", mask=True))
        elif name == "token_type_ids":
            values.append(RealInput(name, (batch, seq), "int64", high=2))
        else:
            values.append(RealInput(name, (batch, seq), "int64", high=vocab))
    return tuple(values)


_LIGHT = (
    ("resnet50", "ResNet-50 (Caffe2 export, onnx light model), seeded weights; 1x3x224x224 -> softmax 1x1000"),
    ("densenet121", "DenseNet-121 (onnx light model, opset 9), seeded weights; 1x3x224x224 -> 1x1000x1x1"),
    ("inception-v1", "GoogLeNet / Inception v1 with LRN (onnx light model), seeded weights; 1x3x224x224 -> softmax"),
    ("inception-v2", "Inception v2 / BN-Inception (onnx light model), seeded weights; 1x3x224x224 -> softmax"),
    ("vgg19", "VGG-19 (onnx light model), seeded weights; 1x3x224x224 -> softmax 1x1000"),
    ("squeezenet", "SqueezeNet 1.0 (onnx light model), seeded weights; 1x3x224x224 -> 1x1000x1x1"),
    ("shufflenet", "ShuffleNet v1 (onnx light model), seeded weights; 1x3x224x224 -> softmax 1x1000"),
    ("alexnet", "BVLC AlexNet with LRN (onnx light model), seeded weights; 1x3x224x224 -> softmax 1x1000"),
    ("zfnet512", "ZFNet-512 with LRN (onnx light model), seeded weights; 1x3x224x224 -> softmax 1x1000"),
)
_LIGHT_FILES = {"inception-v1": "inception_v1", "inception-v2": "inception_v2", "alexnet": "bvlc_alexnet"}
_LIGHT_INPUT = {"resnet50": "gpu_0/data_0", "shufflenet": "gpu_0/data_0", "zfnet512": "gpu_0/data_0"}

_IMAGE_AXES = ("batch", "height", "width")
_BERT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]

REAL_MODELS: dict[str, RealModelSpec] = {
    spec.name: spec
    for spec in (
        *(RealModelSpec(name, description, "onnx-light", _light_builder(_LIGHT_FILES.get(name, name)),
                        (RealInput(_LIGHT_INPUT.get(name, "data_0"), (1, 3, 224, 224)),))
          for name, description in _LIGHT),
        RealModelSpec("efficientnet-b0", "EfficientNet-B0 with TF 'same' padding computed at run time (dynamic Pad), "
                      "SiLU, squeeze-excite; input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: EfficientNetB0()), _image_inputs(), _IMAGE_AXES),
        RealModelSpec("mobilenetv2-tf", "MobileNetV2 1.0 with TF 'same' padding computed at run time (dynamic Pad), "
                      "ReLU6; input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: MobileNetV2()), _image_inputs(), _IMAGE_AXES),
        RealModelSpec("regnety-400mf", "RegNetY-400MF (depths 1-3-6-6, widths 48-440, grouped 3x3 convs of group width "
                      "8, squeeze-excite); input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: RegNetY400MF()), _image_inputs(), _IMAGE_AXES),
        RealModelSpec("convnext-t", "ConvNeXt-T (depths 3-3-9-3, dims 96-768), LayerNorm2d written out, layer scale; "
                      "input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: ConvNeXt(rng)), _image_inputs(), _IMAGE_AXES),
        RealModelSpec("convnext-t-lite", "ConvNeXt-T widths with depths 1-1-3-1; input 1x3x224x224 -> 1x1000",
                      "pytorch", _image_export(lambda rng: ConvNeXt(rng, depths=(1, 1, 3, 1))), _image_inputs(),
                      _IMAGE_AXES),
        RealModelSpec("swin-t", "Swin-T (depths 2-2-6-2, window 7, shifted windows, relative position bias), "
                      "reshapes from x.shape; input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: SwinTransformer(rng)), _image_inputs(), ("batch",)),
        RealModelSpec("swin-t-lite", "Swin-T widths with depths 2-2-2-2; input 1x3x224x224 -> 1x1000", "pytorch",
                      _image_export(lambda rng: SwinTransformer(rng, depths=(2, 2, 2, 2))), _image_inputs(),
                      ("batch",)),
        RealModelSpec("bert-base", "BERT-base (12 layers x 768, 12 heads, vocab 30522): ids, mask, token types "
                      "1x128 -> last hidden 1x128x768, pooled 1x768", "pytorch",
                      _text_export(lambda rng: Bert(), _BERT_INPUTS, ["last_hidden_state", "pooler_output"], 30522),
                      _text_inputs(_BERT_INPUTS, 30522), ("batch", "sequence")),
        RealModelSpec("bert-4l", "BERT-base structure, 4 layers x 512, 8 heads: ids, mask, token types 2x64 -> "
                      "last hidden, pooled", "pytorch",
                      _text_export(lambda rng: Bert(hidden=512, layers=4, heads=8, ffn=2048), _BERT_INPUTS,
                                   ["last_hidden_state", "pooler_output"], 30522),
                      _text_inputs(_BERT_INPUTS, 30522, seq=64, batch=2), ("batch", "sequence")),
        RealModelSpec("distilbert", "DistilBERT-base (6 layers x 768): ids, mask 1x128 -> last hidden 1x128x768",
                      "pytorch", _text_export(lambda rng: DistilBert(), ["input_ids", "attention_mask"],
                                              ["last_hidden_state"], 30522),
                      _text_inputs(["input_ids", "attention_mask"], 30522), ("batch", "sequence")),
        RealModelSpec("gpt2", "GPT-2 small (12 layers x 768, vocab 50257, causal mask from a buffer): ids 1x128 -> "
                      "logits 1x128x50257", "pytorch",
                      _text_export(lambda rng: GPT2(rng), ["input_ids"], ["logits"], 50257, embed_std=0.2),
                      _text_inputs(["input_ids"], 50257), ("batch", "sequence")),
        RealModelSpec("gpt2-4l", "GPT-2 structure, 4 layers x 768, vocab 50257: ids 1x64 -> logits 1x64x50257",
                      "pytorch", _text_export(lambda rng: GPT2(rng, layers=4), ["input_ids"], ["logits"], 50257, 64,
                                                   embed_std=0.2),
                      _text_inputs(["input_ids"], 50257, seq=64), ("batch", "sequence")),
        RealModelSpec("t5-small", "T5-small encoder-decoder (6+6 layers x 512, relative position buckets): ids, mask "
                      "1x128, decoder ids 1x32 -> logits 1x32x32128", "pytorch",
                      _text_export(lambda rng: T5(), ["input_ids", "attention_mask", "decoder_input_ids"],
                                   ["logits"], 32128),
                      (*_text_inputs(["input_ids", "attention_mask"], 32128),
                       RealInput("decoder_input_ids", (1, 32), "int64", high=32128)),
                      ("batch", "sequence", "decoder_sequence")),
        RealModelSpec("llama-small", "Llama structure (8 layers x 512, GQA 8/4 heads, RoPE, SwiGLU 1408, RMSNorm, "
                      "vocab 32000): ids 1x128 -> logits 1x128x32000", "pytorch",
                      _text_export(lambda rng: Llama(), ["input_ids"], ["logits"], 32000),
                      _text_inputs(["input_ids"], 32000), ("batch", "sequence")),
    )
}
