"""Playing greedy episodes on fixed seeds: any `act(obs) -> int`, one episode at a time or side by side.

Every policy is played on the same seeds (eval.seed .. eval.seed + episodes - 1), so differences
between variants are paired comparisons, not noise between episode draws. Episodes here are
evaluation episodes: under SB3's Atari preprocessing, whole games with the game's own rewards
(make_env_from's whole_games), as the RL Zoo reports returns. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from compress_dqn.envs.environment import make_env_from
from compress_dqn.recipe.schema import EnvConfig

Act = Callable[[np.ndarray], int]


def run_episodes(act: Act, env: EnvConfig, seeds: Iterable[int]) -> list[float]:
    """Play one greedy episode per seed and return the undiscounted returns."""
    instance = make_env_from(env, whole_games=True)
    returns = []
    try:
        for seed in seeds:
            obs, _ = instance.reset(seed=int(seed))
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = instance.step(act(obs))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        instance.close()
    return returns


QValues = Callable[[np.ndarray], np.ndarray]


def run_episodes_side_by_side(q_values: QValues, env: EnvConfig, seeds: Iterable[int]) -> list[float]:
    """The returns of run_episodes(greedy q_values), the episodes played side by side, each in
    its own environment: one forward pass per step, over a row for every episode.

    Why: some actors cost the same per call at batch 1 as at batch 10 (a fake-quantized Keras
    model), so playing one episode at a time spends nearly all of a QAT
    fine-tune's snapshot selection on call overhead. Each episode sees the same observations
    and takes the greedy action of its own row, so the returns equal run_episodes's wherever
    q_values gives a row the same values in a batch as alone. Every call gets every episode's
    row (a finished one keeps its last observation, its action unused): one batch shape, so a
    tf.function traces once, not once per episode that ends.
    """
    seeds = [int(seed) for seed in seeds]
    instances = [make_env_from(env, whole_games=True) for _ in seeds]
    try:
        observations = [instance.reset(seed=seed)[0] for instance, seed in zip(instances, seeds)]
        returns = [0.0] * len(seeds)
        running = list(range(len(seeds)))
        while running:
            actions = np.argmax(q_values(np.stack(observations)), axis=1)
            still = []
            for i in running:
                observations[i], reward, terminated, truncated, _ = instances[i].step(int(actions[i]))
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            running = still
    finally:
        for instance in instances:
            instance.close()
    return returns


def random_returns(env: EnvConfig, seeds: Iterable[int], n_actions: int) -> list[float]:
    """Returns of a uniform-random policy on the given episode seeds (the floor of normalized
    scores). Each episode draws its actions from its own seed, so episode i's return does not
    depend on which episodes were played before it."""
    returns = []
    for seed in seeds:
        rng = np.random.default_rng([int(seed), 0x5EED])
        returns += run_episodes(lambda _obs: int(rng.integers(n_actions)), env, [seed])
    return returns
