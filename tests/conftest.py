"""Shared fixtures: tests shrink the recipe, not the code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "recipes" / "tiny.yaml"


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `compress-dqn ARGS` in a fresh interpreter, as a user would."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run(
        [sys.executable, "-m", "compress_dqn", *args],
        cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def tiny_recipe() -> Path:
    return TINY


@pytest.fixture(scope="session")
def trained_tiny():
    """A tiny baseline trained once per test session: (recipe, TrainResult)."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.rl.trainer import DQNTrainer

    recipe = load_recipe(TINY, ["train.total_timesteps=600", "train.net_arch=[32, 32]"])
    result = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=0, quiet=True).train()
    return recipe, result


def variant(recipe, **fields):
    """A validated VariantConfig for tests."""
    from compress_dqn.recipe.schema import VariantConfig

    return VariantConfig.model_validate({"name": "v", **fields})
