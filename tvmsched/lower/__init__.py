"""Lowering: ONNX -> Relax -> fused layers (TIR PrimFuncs); targets; default CPU and GPU schedules; kernel libraries."""
