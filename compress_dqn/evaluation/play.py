"""Playing a policy's evaluation episodes: on fixed seeds, and as a look worker's unit (plain data in and out)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.episodes import Act, play_side_by_side, random_returns, run_episodes
from compress_dqn.evaluation.verdicts import ReturnStats, summarize
from compress_dqn.recipe.schema import EnvConfig

WIDTH = 256
"""Episodes a TFLite policy plays side by side: one interpreter call per step at batch 256 costs
less than half of 256 calls at batch 1, and the environment's numpy step is shared by as many
(docs/evaluation-speed.md)."""


def play_policy(policy: TFLitePolicy, env: EnvConfig, seeds: Iterable[int], width: int = WIDTH) -> list[float]:
    """The returns of a TFLite policy's episodes on `seeds`, `width` of them side by side, each
    playing its own row of the `action` output (what the policy plays alone, row for row: LiteRT's
    kernels compute a row of a batch as they compute it alone, tests/test_play_batched.py)."""
    return play_side_by_side(lambda observations, _: policy.actions(observations), env, seeds, width)


def play_unit(env: EnvConfig, tflite: str | None, n_actions: int, first_seed: int, count: int) -> list[float]:
    """The returns of `count` episodes on seeds first_seed.. of the TFLite policy at `tflite`, or of a
    uniform-random policy where it is None. No TensorFlow: a pool worker starts in about a second.
    Each episode depends only on its seed, so chunks of a range played apart give the returns of
    the range played at once."""
    seeds = range(first_seed, first_seed + count)
    if tflite is None:
        return random_returns(env, seeds, n_actions)
    return play_policy(TFLitePolicy(Path(tflite)), env, seeds)


def evaluate(policy: TFLitePolicy | Act, env: EnvConfig, episodes: int, seed: int) -> ReturnStats:
    """Evaluate on seeds seed .. seed+episodes-1: a TFLitePolicy side by side (play_policy), any
    other `act(obs) -> int` one episode at a time."""
    seeds = range(seed, seed + episodes)
    if isinstance(policy, TFLitePolicy):
        return summarize(play_policy(policy, env, seeds))
    return summarize(run_episodes(policy, env, seeds))
