"""Pydantic's validation errors as the recipe's one-line messages: `dotted.key: what is wrong; what is allowed`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}


def _format_error(error: Any) -> str:
    loc = ".".join(str(part) for part in error["loc"])
    kind, value, ctx = error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "unknown_key":
        where = f"{loc}.{ctx['key']}" if loc else ctx["key"]
        return f"{where}: {error['msg']}"
    if kind == "missing":
        return f"{loc}: required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{loc or 'recipe'}: expected a mapping of keys, got {value!r}"
    message = error["msg"]
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        return f"{loc}: {message}" if loc else message
    if kind == "literal_error":
        return f"{loc}: {value!r} is not allowed; expected {ctx.get('expected', message)}"
    if kind in _BOUNDS:
        ((bound, limit),) = ctx.items()
        return f"{loc}: {value!r} must be {_BOUNDS[kind]} {limit if isinstance(limit, int) else format(limit, 'g')}"
    if kind in ("byte_size", "byte_size_unit"):
        return (f"{loc}: {value!r} is not a size; write a whole number of bytes or a number with a unit from "
                "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. 512MiB)")
    return f"{loc}: {value!r} is invalid: {message[0].lower()}{message[1:]}"


def format_validation_error(exc: ValidationError, limit: int = 3) -> str:
    """One line: the first few problems, each as `dotted.key: what is wrong; what is allowed`."""
    errors = exc.errors(include_url=False)
    text = "; ".join(_format_error(e) for e in errors[:limit])
    if len(errors) > limit:
        text += f" (and {len(errors) - limit} more)"
    return text.replace("\n", " ")
