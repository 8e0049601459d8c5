"""Loading a recipe: the YAML file or parsed data, --set overrides, validation into a Recipe, paths made absolute.

This module must not import TensorFlow or numpy: `validate` and `--help` stay fast.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from compress_dqn.errors import UserError
from compress_dqn.recipe.env import EnvConfig
from compress_dqn.recipe.recipe import Recipe
from compress_dqn.recipe.safe_yaml import read_yaml, read_yaml_text
from compress_dqn.recipe.validation_errors import format_validation_error


def _apply_override(data: dict[str, Any], override: str) -> None:
    """Apply `train.gamma=0.9` (the value is read as YAML) to the raw recipe data; `variants.NAME.key`
    reaches into the variant of that name."""
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise UserError(f"--set {override!r}: write KEY=VALUE, e.g. --set train.total_timesteps=1000")
    try:
        value = read_yaml_text(raw, f"--set {key.strip()}")
    except UserError:
        if raw.lstrip().startswith(("&", "*", "[", "{")):  # YAML that failed a guard, not a plain string
            raise
        value = raw
    node = data
    parts = key.strip().split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if part == "variants" and isinstance(child, list):  # variants.NAME.key: the variant of that name
            child = {v.get("name"): v for v in child if isinstance(v, dict)}
            if parts[i + 1] not in child:
                raise UserError(f"--set {override!r}: the recipe has no variant named {parts[i + 1]!r}")
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"--set {override!r}: {part} is not a section")
        node = child
    node[parts[-1]] = value


def recipe_from_data(data: Any, source: str = "recipe", overrides: tuple[str, ...] = ()) -> Recipe:
    """Validate already-parsed recipe data (used by load_recipe and by resume checks)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of keys at the top level, got {type(data).__name__}")
    for override in overrides:
        _apply_override(data, override)
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{source}: {format_validation_error(exc)}") from None
    except RecursionError:
        raise UserError(f"{source}: recipe nests too deeply (recursive anchors?)") from None


def env_from_data(env: dict[str, Any], overrides: tuple[str, ...] = (), source: str = "--env") -> EnvConfig:
    """An env block as data with the env.* overrides of `overrides` applied (the others are left for the
    recipe), validated: what a command probes before it writes its recipe, so --set env.kwargs.K=V,
    env.max_episode_steps and env.wrappers shape the environment it reads."""
    data: dict[str, Any] = {"env": dict(env)}
    for override in overrides:
        if override.partition("=")[0].strip().split(".")[0] == "env":
            _apply_override(data, override)
    try:
        return EnvConfig.model_validate(data["env"])
    except ValidationError as exc:
        raise UserError(f"{source}: env.{format_validation_error(exc)}") from None


def load_recipe(path: str | Path, overrides: tuple[str, ...] | list[str] = ()) -> Recipe:
    """Load and validate a recipe file; the name defaults to the file's stem."""
    path = Path(path)
    data = read_yaml(path)
    if isinstance(data, dict) and "name" not in data:
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]", "-", path.stem).lstrip(".-_") or "run"
    recipe = recipe_from_data(data, str(path), tuple(overrides))
    if recipe.baseline is not None:  # files named in a recipe are relative to the recipe
        here = path.absolute().parent
        update = {"from_": str(here / Path(recipe.baseline.from_).expanduser())}
        if recipe.baseline.transitions is not None:
            update["transitions"] = str(here / Path(recipe.baseline.transitions).expanduser())
        for key, value in update.items():  # refuse a missing file before anything is written
            if not Path(value).exists():
                name = "from" if key == "from_" else key
                raise UserError(f"baseline.{name}: {value}: no such file or directory; check the path "
                                "(relative paths are taken from the recipe's folder)")
        recipe = recipe.model_copy(update={"baseline": recipe.baseline.model_copy(update=update)})
    return recipe
