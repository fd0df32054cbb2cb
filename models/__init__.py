"""Bundled ONNX model zoo: small, deterministic, fully static float32 models.

Every model is generated on demand with ``onnx.helper`` from seeded random
weights (opset 17, IR version 8); nothing is downloaded or stored on disk.
Real architectures (PyTorch exports, the onnx package's light models with seeded
weights) are in :data:`REAL_MODELS` (``models.real``, cached on disk).

Example:
    >>> from tvmsched import models
    >>> model = models.build("resnet18-small", seed=0)
    >>> feeds = models.random_inputs(model)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import onnx

from .bert import build_bert_tiny
from .common import IR_VERSION, OPSET, random_inputs
from .embedding import build_bert_tiny_ids, build_dlrm_small
from .mlp import build_mlp
from .mobilenet import build_mobilenetv2
from .resnet import build_resnet18, build_resnet18_small
from .tiny import build_tiny

__all__ = [
    "IR_VERSION",
    "MODELS",
    "OPSET",
    "ModelSpec",
    "UnknownModelError",
    "build",
    "list_models",
    "random_inputs",
    "save",
]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model.

    Attributes:
        name: Registry name.
        description: One-line summary including input/output shapes.
        builder: Callable mapping a seed to the ONNX model.
    """

    name: str
    description: str
    builder: Callable[[int], onnx.ModelProto]


class UnknownModelError(KeyError, ValueError):
    """Raised for a model name that is not in :data:`MODELS`."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("tiny", "y = Relu(x @ 2I - 1); x, y: 1x4 (weights fixed)", build_tiny),
        ModelSpec("mlp", "784-256-128-10 MLP with Softmax; input 1x784 -> output 1x10", build_mlp),
        ModelSpec("resnet18", "ResNet-18; input 1x3x224x224 -> output 1x1000", build_resnet18),
        ModelSpec(
            "resnet18-small",
            "ResNet-18 topology, widths 16-128; input 1x3x64x64 -> output 1x10",
            build_resnet18_small,
        ),
        ModelSpec(
            "mobilenetv2",
            "MobileNetV2-style inverted residuals; input 1x3x96x96 -> output 1x10",
            build_mobilenetv2,
        ),
        ModelSpec(
            "bert-tiny",
            "2-layer BERT-tiny encoder; hidden_states 1x128x128 -> output 1x128x128",
            build_bert_tiny,
        ),
        ModelSpec(
            "bert-tiny-ids",
            "bert-tiny from token ids (30522-row embedding); input_ids 1x128 int64 -> output 1x128x128",
            build_bert_tiny_ids,
        ),
        ModelSpec(
            "dlrm-small",
            "DLRM-style: 8 embedding bags of 40000x16, two MLPs; dense 32x13 + ids0..7 32x4 int64 -> 32x1",
            build_dlrm_small,
        ),
    )
}


def list_models() -> list[ModelSpec]:
    """Returns the registered models in registration order."""
    return list(MODELS.values())


def _lookup(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        from .real import REAL_MODELS

        if name in REAL_MODELS:  # built through its on-disk cache
            from functools import partial

            from .real import build_real

            spec = REAL_MODELS[name]
            return ModelSpec(spec.name, spec.description, partial(build_real, name))
        valid = ", ".join(MODELS)
        raise UnknownModelError(f"unknown model {name!r}; valid names: {valid}; real architectures: "
                                f"{', '.join(REAL_MODELS)}") from None


def build(name: str, seed: int = 0) -> onnx.ModelProto:
    """Builds a registered model (or a real architecture, :data:`REAL_MODELS`, from its on-disk cache).

    Args:
        name: Registry name, see :func:`list_models` and :data:`REAL_MODELS`.
        seed: Weight seed; the same seed gives byte-identical models.

    Returns:
        The ONNX model.

    Raises:
        UnknownModelError: If ``name`` is not registered.
    """
    return _lookup(name).builder(seed)


def save(name: str, path: str | PathLike[str], seed: int = 0) -> Path:
    """Builds a registered model and writes it to ``path``.

    Args:
        name: Registry name.
        path: Destination ``.onnx`` file; parent folders are created.
        seed: Weight seed.

    Returns:
        The path written.

    Raises:
        UnknownModelError: If ``name`` is not registered.
    """
    out = Path(path)
    if name not in MODELS and _lookup(name):  # a real architecture (or an error naming both lists): the cached file
        import shutil

        from .real import real_model_path

        source = real_model_path(name, seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, out)
        return out
    model = build(name, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(out))
    return out


_REAL_NAMES = ("REAL_MODELS", "RealModelSpec", "RealInput", "build_real", "real_inputs", "real_model_path")


def __getattr__(name: str):
    """The real architectures (models.real) load on first use: they import torch."""
    if name in _REAL_NAMES:
        from . import real

        return getattr(real, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
