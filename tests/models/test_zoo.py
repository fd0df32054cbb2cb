"""Tests for the bundled ONNX model zoo (tvmsched.models)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvmsched import models

ort = pytest.importorskip("onnxruntime")

NAMES = list(models.MODELS)


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _declared_shape(value: onnx.ValueInfoProto) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    assert all(d.HasField("dim_value") for d in dims), f"{value.name} is not static"
    return tuple(d.dim_value for d in dims)


@pytest.fixture(scope="module", params=NAMES)
def built(request: pytest.FixtureRequest) -> tuple[str, onnx.ModelProto]:
    return request.param, models.build(request.param, seed=0)


def test_registry_names() -> None:
    assert NAMES == ["tiny", "mlp", "resnet18", "resnet18-small", "mobilenetv2", "bert-tiny", "bert-tiny-ids", "dlrm-small"]
    assert [s.name for s in models.list_models()] == NAMES
    for name, spec in models.MODELS.items():
        assert spec.name == name and spec.description


def test_checker_and_versions(built: tuple[str, onnx.ModelProto]) -> None:
    _, model = built
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == models.IR_VERSION == 8
    assert [(o.domain, o.version) for o in model.opset_import] == [("", models.OPSET)]
    index_inputs = {p.key.removeprefix("index_range:") for p in model.metadata_props if p.key.startswith("index_range:")}
    for value in [*model.graph.input, *model.graph.output]:
        expected = onnx.TensorProto.INT64 if value.name in index_inputs else onnx.TensorProto.FLOAT
        assert value.type.tensor_type.elem_type == expected
        _declared_shape(value)
    for init in model.graph.initializer:
        assert init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.INT64)


def test_onnxruntime_outputs_finite(built: tuple[str, onnx.ModelProto], reference) -> None:
    _, model = built
    feeds = models.random_inputs(model, seed=0)
    assert {v.name: _declared_shape(v) for v in model.graph.input} == {
        k: v.shape for k, v in feeds.items()
    }
    found = reference(model, feeds)  # onnxruntime's outputs, shared with the run's other tests
    assert sorted(found) == sorted(v.name for v in model.graph.output)
    outputs = [found[value.name] for value in model.graph.output]
    for value, out in zip(model.graph.output, outputs, strict=True):
        assert out.shape == _declared_shape(value)
        assert out.dtype == np.float32
        assert np.isfinite(out).all()
        assert np.abs(out).max() < 1e3


def test_deterministic(built: tuple[str, onnx.ModelProto]) -> None:
    name, model = built
    assert models.build(name, seed=0).SerializeToString() == model.SerializeToString()


def test_seed_changes_weights(built: tuple[str, onnx.ModelProto]) -> None:
    name, model = built
    other = models.build(name, seed=1)
    if name == "tiny":
        assert other.SerializeToString() == model.SerializeToString()
        return
    assert other.SerializeToString() != model.SerializeToString()
    changed = [
        a.name
        for a, b in zip(model.graph.initializer, other.graph.initializer, strict=True)
        if not np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    ]
    assert changed


def test_random_inputs_seeded() -> None:
    model = models.build("bert-tiny")
    a = models.random_inputs(model, seed=3)["hidden_states"]
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, models.random_inputs(model, seed=3)["hidden_states"])
    assert not np.array_equal(a, models.random_inputs(model, seed=4)["hidden_states"])


def test_tiny_formula() -> None:
    model = models.build("tiny")
    x = np.array([[-1.5, 0.25, 0.5, 3.0]], dtype=np.float32)
    (y,) = _run(model, {"x": x})
    np.testing.assert_array_equal(y, np.array([[0.0, 0.0, 0.0, 5.0]], dtype=np.float32))
    x = models.random_inputs(model, seed=7)["x"]
    (y,) = _run(model, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(2 * x - 1, 0).astype(np.float32))


def test_unknown_model() -> None:
    with pytest.raises(models.UnknownModelError, match="resnet18-small"):
        models.build("resnet19")
    assert issubclass(models.UnknownModelError, ValueError)
    assert issubclass(models.UnknownModelError, KeyError)


def test_save_round_trip(tmp_path) -> None:
    path = models.save("mlp", tmp_path / "sub" / "mlp.onnx", seed=2)
    loaded = onnx.load(str(path))
    assert loaded.SerializeToString() == models.build("mlp", seed=2).SerializeToString()
