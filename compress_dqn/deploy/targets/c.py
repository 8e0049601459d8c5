"""`export --target c`: one dependency-free C99 file and header, with measured Cortex-M flash and RAM (deploy/c_*.py)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.targets.base import ExportOptions, ExportReport, Target


def export(policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """NAME.c and NAME.h in `out` (default c/NAME), their cost and time per action."""
    from compress_dqn.deploy.c.measure import export_c

    return export_c(policy, out, options.name)


TARGET = Target("c", frozenset({"name"}), out_is_dir=True, out_words="the directory for NAME.c and NAME.h", export=export)
