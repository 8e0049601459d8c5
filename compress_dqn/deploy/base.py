"""What every export target shares: the options it is given, the typed record it returns, and the policy's name.

Each target's `export(policy, out, options: ExportOptions) -> ExportReport` is a row of the registry
(deploy/registry.py), so the command line looks one up and prints its `ExportReport`; which option a
target takes, and whether its --out is a file or a directory, is data there, not an if/else chain in cli.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, JsonValue


class ExportOptions(BaseModel):
    """The options `compress-dqn export` passes to a target (unset ones stay at their defaults; the registry's
    OPTIONS holds each one's flag and help)."""

    model_config = ConfigDict(frozen=True)
    int8_io: bool = False
    name: str | None = None
    compress: bool = False
    onnx_int8: Literal["exact", "qdq"] | None = None

    def given(self) -> set[str]:
        """The options set away from their defaults."""
        return {key for key, value in self if value not in (None, False)}


class ExportReport(BaseModel):
    """What an export wrote, as the command prints it (`to_dict`). Each target's record declares its fields
    (`policy` first) in the order the command prints them; scripts read that JSON by key, so a key is renamed
    only with its readers."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    omit_none: ClassVar[frozenset[str]] = frozenset()
    """Keys printed only when they hold something (absent from the JSON otherwise, not null)."""

    def to_dict(self) -> dict[str, JsonValue]:
        """The JSON the command prints."""
        data = self.model_dump(mode="json", by_alias=True)
        return {k: v for k, v in data.items() if not (k in self.omit_none and v is None)}


def policy_name(policy: Path) -> str:
    """The one rule for a policy's name: runs/X/variants/NAME/policy.tflite -> NAME, else the file's stem."""
    policy = Path(policy)
    return policy.parent.name if policy.stem == "policy" and policy.parent.name else policy.stem


def c_identifier(name: str) -> str:
    """A C identifier from a policy name, case kept (student-32x32-qat-int8 -> student_32x32_qat_int8): the
    C export's file and function names."""
    cleaned = "".join(ch if ch.isalnum() else "_" for ch in name).strip("_") or "policy"
    return cleaned if not cleaned[0].isdigit() else f"p_{cleaned}"


_CPP_KEYWORDS = {"and", "auto", "bool", "break", "case", "char", "class", "const", "default", "delete", "do",
                 "double", "else", "enum", "float", "for", "if", "int", "long", "namespace", "new", "not", "or",
                 "private", "public", "return", "short", "signed", "static", "struct", "switch", "template",
                 "this", "tflite", "union", "unsigned", "using", "void", "while", "std"}


def cpp_identifier(name: str) -> str:
    """A lower-case C++ identifier from a policy name, clear of C++ keywords and TFLM's namespace: the
    micro export's namespace and file names."""
    ident = re.sub(r"\W+", "_", name, flags=re.ASCII).strip("_").lower() or "policy"
    if ident[0].isdigit():
        ident = f"policy_{ident}"
    return f"{ident}_policy" if ident in _CPP_KEYWORDS else ident
