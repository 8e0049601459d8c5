"""`export --target tflite`: the one checked, self-contained .tflite to ship, with LiteRT usage (deploy/ship.py)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.targets.base import ExportOptions, ExportReport, Target


def export(policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """The checked copy at `out` (default ./NAME.tflite) and its usage snippets."""
    from compress_dqn.deploy.litert.ship import export_tflite_file

    return export_tflite_file(policy, out)


TARGET = Target("tflite", frozenset(), out_is_dir=False, out_words="the .tflite file to write", export=export)
