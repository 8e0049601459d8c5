"""`export --target onnx`: an ONNX model for onnxruntime, int8 policies in integer ops or QDQ (deploy/onnx_*.py)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.targets.base import ExportOptions, ExportReport, Target


def export(policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """The .onnx file at `out` (default ./NAME.onnx) in the int8 form asked for (exact by default)."""
    from compress_dqn.deploy.onnx.export import export_onnx_file

    return export_onnx_file(policy, out, int8=options.onnx_int8 or "exact")


TARGET = Target("onnx", frozenset({"onnx_int8"}), out_is_dir=False, out_words="the .onnx file to write", export=export)
