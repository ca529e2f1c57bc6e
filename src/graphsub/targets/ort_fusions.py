"""onnxruntime's fused com.microsoft operators (fused attention, SkipLayerNormalization,
BiasGelu, rotary embedding, ...) as candidates of their own, behind an explicit option.

graphsub's output is standard ONNX by default. onnxruntime also runs operators of its own
domain, which fuse more than the standard ones can (Q, K and V with their biases in one
attention call; a residual sum with the layer norm after it), at the price of a model that only
onnxruntime runs. With `optimize_model(..., ort_fusions=True)` (`graphsub optimize
--ort-fusions`), the original and the best of graphsub's candidates are also written with
those operators, by onnxscript's ORT fusions (the pattern library the onnxruntime team keeps
for the dynamo exporter's graphs), and measured, chosen and verified like every candidate:
the fused form is written only where it runs faster and computes the same.
"""

from __future__ import annotations

from graphsub.errors import GraphsubError

def unavailable_reason() -> str | None:
    """Why the fusions cannot run here (None: they can)."""
    try:
        import onnx_ir  # noqa: F401
        from onnxscript.rewriter.ort_fusions import optimize_for_ort  # noqa: F401
    except ImportError as exc:
        return (f"onnxscript is not installed ({exc}); install it with "
                "pip install 'graphsub[ort-fusions]'")
    return None


def check_available() -> None:
    reason = unavailable_reason()
    if reason is not None:
        raise GraphsubError(f"--ort-fusions needs onnxscript's ORT fusions: {reason}")


def fuse(model: bytes) -> bytes | None:
    """The model with onnxruntime's fused operators where onnxscript's patterns match it
    (None: none matched). A failure inside onnxscript is the candidate's loss, not the run's:
    it raises GraphsubError, which the caller notes."""
    import onnx
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    try:
        fused, counts = optimize_for_ort(ir.from_proto(onnx.load_from_string(model)))
        if not any(counts.values()):
            return None
        written: bytes = ir.to_proto(fused).SerializeToString()
        return written
    except Exception as exc:  # noqa: BLE001 - a third-party rewriter's failure, any kind
        raise GraphsubError(f"onnxscript's ORT fusions failed: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}") from None
