"""ONNX import and its checks: loading and validating a model, folding and rewriting its graph, index checks."""
