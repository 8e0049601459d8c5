"""The export targets, one module per runtime (tflite, micro, c, onnx), and the registry the command line asks.

`export_policy(target, policy, out, options)` checks the options and the --out path against the
target's entry, then calls its `export`, which returns a typed `ExportReport`.
"""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.targets import c, micro, onnx, tflite
from compress_dqn.deploy.targets.base import OPTION_FLAGS, ExportOptions, ExportReport, Target, policy_name
from compress_dqn.errors import UserError

TARGETS: dict[str, Target] = {t.name: t for t in (micro.TARGET, tflite.TARGET, c.TARGET, onnx.TARGET)}
"""Each target by its --target name; the first is the command's default."""

__all__ = ["TARGETS", "ExportOptions", "ExportReport", "Target", "export_policy", "policy_name"]


def _refuse_options(target: Target, options: ExportOptions) -> None:
    """Options the target does not take, named with the targets that do take them."""
    extra = [key for key in OPTION_FLAGS if key in options.given() - target.options]
    if not extra:
        return
    takers = [t.name for t in TARGETS.values() if set(extra) & t.options]
    flags = ", ".join(OPTION_FLAGS[key] for key in extra)
    many = len(extra) > 1
    raise UserError(f"{flags} {'are' if many else 'is'} for --target {' and '.join(takers)}; "
                    f"drop {'them' if many else 'it'} for --target {target.name}")


def export_policy(target: str, policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """Export `policy` for the named target after checking its options and --out; the typed record of what it wrote."""
    entry = TARGETS[target]
    _refuse_options(entry, options)
    entry.check_out(out)
    return entry.export(Path(policy), out, options)
