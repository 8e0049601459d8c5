"""Playing a policy's evaluation episodes: on fixed seeds, and as a look worker's unit (plain data in and out)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.policy import TFLitePolicy
from compress_dqn.envs.episodes import Act, random_returns, run_episodes
from compress_dqn.evaluation.verdicts import ReturnStats, summarize
from compress_dqn.recipe.schema import EnvConfig


def play_unit(env: EnvConfig, tflite: str | None, n_actions: int, first_seed: int, count: int) -> list[float]:
    """The returns of `count` episodes on seeds first_seed.. of the TFLite policy at `tflite`, or of a
    uniform-random policy where it is None. No TensorFlow: a pool worker starts in about a second.
    Each episode depends only on its seed, so chunks of a range played apart give the returns of
    the range played at once."""
    seeds = range(first_seed, first_seed + count)
    if tflite is None:
        return random_returns(env, seeds, n_actions)
    return run_episodes(TFLitePolicy(Path(tflite)).act, env, seeds)


def evaluate(act: Act, env: EnvConfig, episodes: int, seed: int) -> ReturnStats:
    """Evaluate on seeds seed .. seed+episodes-1."""
    return summarize(run_episodes(act, env, range(seed, seed + episodes)))
