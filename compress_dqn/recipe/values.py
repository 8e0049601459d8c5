"""The recipe's value types: counts, reals, seeds, sizes, names and learning rates, and the strict base model.

Counts may be written as 1e6 and numbers as 1e-3 (YAML reads those as strings); bounds are
pydantic constraints, worded by validation_errors.format_validation_error. A constraint that
several keys share is one named type here, so its bounds and wording are stated once.
"""

from __future__ import annotations

import difflib
import math
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError


def parse_count(value: Any) -> Any:
    """Accept 50000, 5e4, "5e4" and "50_000" for integer counts; reject fractions and booleans."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, str):
        text = value.strip().replace("_", "")
        try:
            value = float(text) if any(c in text.lower() for c in ".e") else int(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a whole number (write e.g. 50000 or 5e4)") from None
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"{value!r} is not a whole number")
        value = int(value)
    return value


def _parse_float(value: Any) -> Any:
    """Accept 2.3e-3 written either way (YAML reads `1e-3` without a dot as a string)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise ValueError(f"{value!r} is not a number") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number")
    return value


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a size")
    return value


MAX_COUNT = 2**63 - 1
"""Counts index NumPy arrays and TensorFlow step counters (int64): a larger one cannot run, and
formatting its byte size would overflow a float."""


def count_from(lo: int = 0) -> Any:
    return Annotated[int, BeforeValidator(parse_count), Field(ge=lo, le=MAX_COUNT)]


def real_between(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> Any:
    bounds = {("gt" if lo_open else "ge"): lo, ("lt" if hi_open else "le"): hi}
    return Annotated[float, BeforeValidator(_parse_float), Field(**{k: v for k, v in bounds.items() if v is not None})]


Count = count_from(0)
PositiveCount = count_from(1)
QatTeacher = Literal["baseline", "float"]
"""Whom a QAT fine-tune distils to (QuantizeConfig.qat_teacher)."""
Seed = Annotated[int, BeforeValidator(parse_count), Field(ge=0, le=2**32 - 1)]
"""A training seed: NumPy's legacy global seed (which TensorFlow's seeding sets) takes 0..2**32-1."""
Probability = real_between(0.0, 1.0)
ByteSize = Annotated[pydantic.ByteSize, BeforeValidator(_not_bool)]
"""536870912, "512MiB", "1.5 GB" (KB/MB/GB are powers of 1000, KiB/MiB/GiB of 1024): pydantic's ByteSize."""
LearningRate = real_between(0.0, 1.0, lo_open=True)
"""An Adam step size: above 0, at most 1."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
"""Letters, digits, '.', '_' and '-', not starting with a symbol (it names a directory)."""


class StrictModel(BaseModel):
    """Rejects unknown keys with a did-you-mean and the list of valid keys."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            valid = [field.alias or name for name, field in cls.model_fields.items()]
            for key in data:
                if key not in valid:
                    close = difflib.get_close_matches(str(key), valid, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise PydanticCustomError(
                        "unknown_key",
                        "unknown key{hint}; valid keys: {valid}",
                        {"key": str(key), "hint": hint, "valid": ", ".join(valid)},
                    )
        return data
