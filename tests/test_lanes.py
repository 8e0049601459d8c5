"""Environments side by side (envs/lanes.py): the numpy Breakout steps as MinAtar's, and an episode
depends on its seed alone, whichever lane or chunk plays it."""

from __future__ import annotations

import numpy as np
import pytest

from compress_dqn.envs.environment import make_env_from, probe_env, reset_episode
from compress_dqn.envs.episodes import play_side_by_side, random_returns, run_episodes
from compress_dqn.envs import lanes as lanes_module
from compress_dqn.envs.lanes import BreakoutLanes, GymLanes, make_lanes
from compress_dqn.recipe.schema import EnvConfig


def tracker(obs: np.ndarray) -> int:
    """A fair Breakout player (no-op, left, right): the paddle follows the column the ball moves to.
    It clears all 30 bricks now and then, so the new wall of bricks gets played too."""
    paddle = int(np.argmax(obs[9, :, 0]))
    ball, trail = np.argwhere(obs[:, :, 1]), np.argwhere(obs[:, :, 2])
    if not len(ball):
        return 0
    x = int(ball[0][1])
    target = min(9, max(0, x + int(np.sign(x - trail[0][1])) if len(trail) else x))
    return 0 if target == paddle else (1 if target < paddle else 2)


def play_both(env: EnvConfig, seeds: list[int], width: int, pick) -> dict[str, int]:
    """Play `seeds` in BreakoutLanes and, lane for lane, in MinAtar's own environments with the same
    actions; assert every observation, reward and end is the same. Counts of what was played."""
    lanes = make_lanes(env, width)
    assert isinstance(lanes, BreakoutLanes)
    own = [make_env_from(env, whole_games=True) for _ in range(width)]
    counts = {"steps": 0, "refills": 0, "truncated": 0, "episodes": 0}
    queue, live = list(seeds), []
    for lane in range(width):
        lanes.start(lane, queue[0])
        assert np.array_equal(reset_episode(own[lane], queue.pop(0)), lanes.obs[lane])
        live.append(lane)
    while live:
        actions = np.array([pick(lanes.obs[lane]) for lane in live])
        bricks = lanes.obs[live, :, :, 3].sum(axis=(1, 2))
        rewards, ended = lanes.step(actions, np.array(live))
        still = []
        for k, lane in enumerate(live):
            obs, reward, terminated, truncated, _ = own[lane].step(int(actions[k]))
            assert np.array_equal(obs, lanes.obs[lane]) and obs.dtype == lanes.obs.dtype, (lane, counts)
            assert (float(reward), terminated or truncated) == (rewards[k], ended[k]), (lane, counts)
            counts["steps"] += 1
            counts["refills"] += int(lanes.obs[lane, :, :, 3].sum() > bricks[k])
            counts["truncated"] += int(truncated and not terminated)
            if ended[k]:
                counts["episodes"] += 1
                if not queue:
                    continue
                lanes.start(lane, queue[0])
                assert np.array_equal(reset_episode(own[lane], queue.pop(0)), lanes.obs[lane])
            still.append(lane)
        live = still
    return counts


@pytest.mark.parametrize("draws", [None, 16])
def test_numpy_breakout_steps_as_minatars_breakout_with_new_walls_of_bricks(draws, monkeypatch):
    """Also with blocks of 16 draws: episodes longer than a block of the lane's random stream."""
    if draws is not None:
        monkeypatch.setattr(lanes_module, "_DRAWS", draws)
    rng = np.random.default_rng(0)

    def mostly_tracking(obs):
        return tracker(obs) if rng.random() < 0.97 else int(rng.integers(3))

    counts = play_both(EnvConfig(id="MinAtar/Breakout-v1", max_episode_steps=10000), list(range(60)), 12, mostly_tracking)
    assert counts["episodes"] == 60 and counts["refills"] > 0, counts  # the rules after the last brick are covered


def test_numpy_breakout_truncates_as_time_limit_does_and_plays_the_full_action_set():
    rng = np.random.default_rng(1)
    counts = play_both(EnvConfig(id="MinAtar/Breakout-v1", max_episode_steps=30), list(range(40)), 7,
                       lambda obs: tracker(obs))
    assert counts["truncated"] > 0, counts
    counts = play_both(EnvConfig(id="MinAtar/Breakout-v0"), list(range(40)), 5, lambda obs: int(rng.integers(6)))
    assert counts["episodes"] == 40


def test_only_minatar_breakout_gets_numpy_lanes():
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/SpaceInvaders-v1"), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/Breakout-v1", frame_stack=2), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="CartPole-v1"), 2), GymLanes)


def test_a_minatar_episode_starts_as_in_a_fresh_environment():
    """MinAtar repeats the last action with probability 0.1, also the previous episode's at a new
    episode's first step: reset_episode starts every episode from a fresh environment's no-op."""
    env = EnvConfig(id="MinAtar/Breakout-v1")
    sticky_first = next(s for s in range(1000) if _first_step_sticks(s))
    fresh = make_env_from(env)
    expected = [reset_episode(fresh, sticky_first)] + [fresh.step(0)[0] for _ in range(3)]
    used = make_env_from(env)
    reset_episode(used, 0)
    used.step(2)  # right: the paddle's last move
    starts = [reset_episode(used, sticky_first)] + [used.step(0)[0] for _ in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(starts, expected))
    used.step(2)
    plain = [used.reset(seed=sticky_first)[0]] + [used.step(0)[0] for _ in range(3)]  # MinAtar's own reset
    assert not all(np.array_equal(a, b) for a, b in zip(plain, expected))  # ... carries the move over


def _first_step_sticks(seed: int) -> bool:
    random = np.random.RandomState(seed)
    random.randint(2)  # the ball's start
    return random.rand() < 0.1


@pytest.mark.parametrize("env_id", ["MinAtar/Breakout-v1", "MinAtar/SpaceInvaders-v1", "CartPole-v1"])
def test_episodes_side_by_side_and_in_chunks_return_what_each_seed_returns_alone(env_id):
    env = EnvConfig(id=env_id, max_episode_steps=500)
    seeds = list(range(30))
    n_actions = probe_env(env).n_actions
    alone = [random_returns(env, [seed], n_actions)[0] for seed in seeds]
    assert random_returns(env, seeds, n_actions, width=8) == alone
    assert random_returns(env, seeds[:11], n_actions, width=4) + random_returns(env, seeds[11:], n_actions) == alone
    assert len(set(alone)) > 1

    def greedy(obs):  # a deterministic policy whose episodes still differ by seed
        if "MinAtar" not in env_id:
            return int(obs[2] > 0)  # CartPole: push towards the lean
        return tracker(obs) if "Breakout" in env_id else int(obs[:, :, 0].argmax() % n_actions)

    played = play_side_by_side(lambda batch, _: np.array([greedy(o) for o in batch]), env, seeds, width=6)
    assert played == run_episodes(greedy, env, seeds) == [run_episodes(greedy, env, [s])[0] for s in seeds]
