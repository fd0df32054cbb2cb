"""Stage 2: legalize Relax ops to TIR and fuse them into layers (one PrimFunc per layer)."""

from __future__ import annotations

from tvmsched.errors import TvmschedError, one_line


def legalize_and_fuse(mod, target):
    """FoldBatchnormToConv2D → DecomposeOpsForInference → LegalizeOps → AnnotateTIROpPattern → FoldConstant → FuseOps → FuseTIR → DCE, under `target`."""
    import tvm
    from tvm import relax

    passes = tvm.ir.transform.Sequential(
        [
            relax.transform.FoldBatchnormToConv2D(),
            relax.transform.DecomposeOpsForInference(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    try:
        with target:
            return passes(mod)
    except Exception as err:
        raise TvmschedError(f"lowering the model to TIR failed: {one_line(err)}") from None
