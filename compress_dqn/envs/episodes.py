"""Playing greedy episodes on fixed seeds: any `act(obs) -> int` one episode at a time, or a batched
chooser with many episodes side by side.

Every policy is played on the same seeds (eval.seed .. eval.seed + episodes - 1), so differences
between variants are paired comparisons, not noise between episode draws. An episode depends on
its seed alone (reset_episode), so a range of seeds played in chunks, one at a time or side by
side, gives the same returns. Episodes here are evaluation episodes: under SB3's Atari
preprocessing, whole games with the game's own rewards (make_env_from's whole_games), as the RL
Zoo reports returns. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from compress_dqn.envs.environment import make_env_from, reset_episode
from compress_dqn.envs.lanes import Lanes, make_lanes
from compress_dqn.recipe.schema import EnvConfig

Act = Callable[[np.ndarray], int]


def run_episodes(act: Act, env: EnvConfig, seeds: Iterable[int]) -> list[float]:
    """Play one greedy episode per seed and return the undiscounted returns."""
    instance = make_env_from(env, whole_games=True)
    returns = []
    try:
        for seed in seeds:
            obs = reset_episode(instance, int(seed))
            total, done = 0.0, False
            while not done:
                obs, reward, terminated, truncated, _ = instance.step(act(obs))
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        instance.close()
    return returns


Choose = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""(a batch of observations, the episode number of each row) -> each row's action."""


def play_side_by_side(choose: Choose, env: EnvConfig, seeds: Iterable[int], width: int,
                      whole_rows: bool = False) -> list[float]:
    """The returns of one episode per seed (episode i on seeds[i]), `width` episodes played side by
    side, each in its own lane (envs/lanes.py): one choose() call per step for all of them, and a
    lane whose episode ends starts the next seed. Each episode sees the observations it sees alone
    and takes its own row's action, so the returns equal run_episodes's wherever choose gives a
    row the action it gives that row alone.

    whole_rows: every call gets every lane's row, also once a lane has no episode left (it keeps its
    last observation, its action unused): one batch shape, for choosers that compile one per shape.
    Otherwise the calls get the running episodes' rows only.
    """
    seeds = [int(seed) for seed in seeds]
    if not seeds:
        return []
    width = max(1, min(int(width), len(seeds)))
    returns = np.zeros(len(seeds))
    lanes = make_lanes(env, width)
    try:
        episode = np.arange(width)  # the episode each lane plays
        for lane in range(width):
            lanes.start(lane, seeds[lane])
        live, upcoming = np.arange(width), width
        while live.size:
            if whole_rows or live.size == width:
                actions = np.asarray(choose(lanes.obs, episode))[live]
            else:
                actions = np.asarray(choose(lanes.obs[live], episode[live]))
            rewards, ended = lanes.step(actions, live)
            returns[episode[live]] += rewards  # in step order, as run_episodes adds them
            if np.count_nonzero(ended):
                live, upcoming = _start_next(lanes, live, ended, episode, seeds, upcoming)
    finally:
        lanes.close()
    return returns.tolist()


def _start_next(lanes: Lanes, live: np.ndarray, ended: np.ndarray, episode: np.ndarray, seeds: list[int],
                upcoming: int) -> tuple[np.ndarray, int]:
    """Start the next seeds in the lanes whose episodes ended, while seeds are left: the lanes
    still running and the next seed's index."""
    keep = ~ended
    for k in np.flatnonzero(ended).tolist():
        if upcoming < len(seeds):
            lanes.start(int(live[k]), seeds[upcoming])
            episode[live[k]] = upcoming
            upcoming += 1
            keep[k] = True
    return live[keep], upcoming


QValues = Callable[[np.ndarray], np.ndarray]


def run_episodes_side_by_side(q_values: QValues, env: EnvConfig, seeds: Iterable[int]) -> list[float]:
    """The returns of run_episodes(greedy q_values), every episode played side by side: one forward
    pass per step over a row for every episode, each episode taking the argmax of its row.

    Why: some actors cost the same per call at batch 1 as at batch 10 (a fake-quantized Keras
    model), so playing one episode at a time spends nearly all of a QAT fine-tune's snapshot
    selection on call overhead. Every call gets every episode's row (one batch shape), so a
    tf.function traces once, not once per episode that ends.
    """
    seeds = list(seeds)
    return play_side_by_side(lambda observations, _: np.argmax(q_values(observations), axis=1), env, seeds,
                             width=len(seeds), whole_rows=True)


def random_returns(env: EnvConfig, seeds: Iterable[int], n_actions: int, width: int = 256) -> list[float]:
    """Returns of a uniform-random policy on the given episode seeds (the floor of normalized
    scores), `width` episodes side by side. Each episode draws its actions from its own seed, one
    draw per step, so episode i's return does not depend on which episodes were played with it."""
    seeds = [int(seed) for seed in seeds]
    generators = [np.random.default_rng([seed, 0x5EED]) for seed in seeds]

    def draw(_observations: np.ndarray, episodes: np.ndarray) -> np.ndarray:
        return np.array([generators[i].integers(n_actions) for i in episodes.tolist()])

    return play_side_by_side(draw, env, seeds, width)
