"""`export --target micro`: C++ for TensorFlow Lite Micro with its measured arena and flash (deploy/micro/)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.targets.base import ExportOptions, ExportReport, Target


def export(policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """The model array, header, example and README in `out` (default micro/NAME)."""
    from compress_dqn.deploy.micro.cpp import export_micro

    return export_micro(policy, out, int8_io=options.int8_io, name=options.name, compress=options.compress)


TARGET = Target("micro", frozenset({"int8_io", "name", "compress"}), out_is_dir=True,
                out_words="the directory for the micro export", export=export)
