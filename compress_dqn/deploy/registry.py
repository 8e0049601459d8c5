"""The export targets in one table, and `export_policy`, which `compress-dqn export` calls.

Each row holds what the command line says about a target (its help, the options it takes, its
default output) and names its export function and availability check by module path, imported
only when used: `compress-dqn --help` builds its --target choices and help from this table without
importing TFLite, onnx or TFLite Micro. Adding a target is one folder under deploy/ (its
`export(policy, out, options) -> ExportReport`) and one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compress_dqn.errors import UserError

if TYPE_CHECKING:
    from compress_dqn.deploy.base import ExportOptions, ExportReport


def load_named(path: str) -> Any:
    """The function a row names as "package.module:function", imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Option:
    """One option of `compress-dqn export`: its flag and what it does (the targets taking it come from the rows)."""

    flag: str
    words: str
    scope: str = ""
    """Which policies it applies to, said after the targets ("onnx, int8 policies: ...")."""


OPTIONS = {
    "int8_io": Option("--int8-io", "int8 observation input and q_values output (full-integer policies)."),
    "name": Option("--name", "C/C++ identifier for the files and namespace (default: the variant or file name)."),
    "compress": Option("--compress", "keep TFLM's look-up-table weight compression when it shrinks the model losslessly."),
    "onnx_int8": Option("--onnx-int8", "exact (the default) repeats LiteRT's reference kernels in integer "
                        "ops, the same actions on every CPU; qdq is QuantizeLinear/DequantizeLinear for onnxruntime's "
                        "fused int8 kernels, about 3x faster a call, whose actions can differ at rounding boundaries by "
                        "CPU (docs/shipping.md).", scope="int8 policies"),
}
"""Each ExportOptions field by key (ExportOptions, deploy/base.py, holds their values)."""


@dataclass(frozen=True)
class Target:
    """One runtime a policy is exported for: what --help says, the options it takes, where it writes, and its
    export function and availability check, named as "module:function" and imported only when called."""

    name: str
    help: str
    options: frozenset[str]
    out_is_dir: bool
    default_out: str
    """--out when none is given, as --help says it (NAME: the policy's name)."""
    out_words: str
    """What --out names, for the message that refuses the wrong kind of path."""
    export_function: str
    """"module:function" of `export(policy, out, options) -> ExportReport`."""
    available_function: str | None = None
    """"module:function" -> bool: whether the optional extra it measures with is installed (None: always)."""

    def export(self, policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
        """The row's export function, imported now and called."""
        return load_named(self.export_function)(policy, out, options)

    def available(self) -> bool:
        """Whether this machine has what the target measures with (its optional extra)."""
        return self.available_function is None or bool(load_named(self.available_function)())

    def check_out(self, out: Path | None) -> None:
        """Refuse an --out of the wrong kind (a file where a directory is written, or the reverse)."""
        if out is not None and self.out_is_dir and out.exists() and not out.is_dir():
            raise UserError(f"{out}: is a file; --out names {self.out_words}")
        if out is not None and not self.out_is_dir and out.is_dir():
            raise UserError(f"{out}: is a directory; --out names {self.out_words}")


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("micro", "C++ for TensorFlow Lite Micro (model array, header, example, README).",
           frozenset({"int8_io", "name", "compress"}), out_is_dir=True, default_out="micro/NAME",
           out_words="the directory for the micro export", export_function="compress_dqn.deploy.micro.cpp:export",
           available_function="compress_dqn.deploy.micro.model:available"),
    Target("tflite", "the one self-contained .tflite to ship, with LiteRT usage for Python and C++.",
           frozenset(), out_is_dir=False, default_out="./NAME.tflite", out_words="the .tflite file to write",
           export_function="compress_dqn.deploy.litert.ship:export"),
    Target("c", "one dependency-free C99 file and header (NAME_act), with measured Cortex-M flash and RAM.",
           frozenset({"name"}), out_is_dir=True, default_out="c/NAME", out_words="the directory for NAME.c and NAME.h",
           export_function="compress_dqn.deploy.c.measure:export",
           available_function="compress_dqn.deploy.c.measure:available"),
    Target("onnx", "an ONNX model for onnxruntime (int8 policies in integer ops; see --onnx-int8).",
           frozenset({"onnx_int8"}), out_is_dir=False, default_out="./NAME.onnx", out_words="the .onnx file to write",
           export_function="compress_dqn.deploy.onnx.export:export"),
)}
"""Each target by its --target name; the first is the command's default."""

DEFAULT = next(iter(TARGETS))


def target_help() -> str:
    """--target's help: each row's name and help."""
    return " ".join(f"{t.name}: {t.help}" for t in TARGETS.values())


def out_help() -> str:
    """--out's help: which targets write a directory and which a file, with each default."""
    dirs = [t for t in TARGETS.values() if t.out_is_dir]
    files = [t for t in TARGETS.values() if not t.out_is_dir]
    return (f"{', '.join(t.name for t in dirs)}: output directory (default: {', '.join(t.default_out for t in dirs)}); "
            f"{', '.join(t.name for t in files)}: the file (default: {', '.join(t.default_out for t in files)}).")


def option_help(key: str) -> str:
    """An option's help: the targets that take it, then what it does."""
    option = OPTIONS[key]
    takers = [t.name for t in TARGETS.values() if key in t.options]
    return f"{', '.join([*takers, option.scope] if option.scope else takers)}: {option.words}"


def _refuse_options(target: Target, options: ExportOptions) -> None:
    """Options the target does not take, named with the targets that do take them."""
    extra = [key for key in OPTIONS if key in options.given() - target.options]
    if not extra:
        return
    takers = [t.name for t in TARGETS.values() if set(extra) & t.options]
    flags = ", ".join(OPTIONS[key].flag for key in extra)
    many = len(extra) > 1
    raise UserError(f"{flags} {'are' if many else 'is'} for --target {' and '.join(takers)}; "
                    f"drop {'them' if many else 'it'} for --target {target.name}")


def export_policy(target: str, policy: Path, out: Path | None, options: ExportOptions) -> ExportReport:
    """Export `policy` for the named target after checking its options and --out; the typed record of what it wrote."""
    entry = TARGETS[target]
    _refuse_options(entry, options)
    entry.check_out(out)
    return entry.export(Path(policy), out, options)
