"""Environments side by side (envs/lanes.py): the numpy Breakout and Space Invaders step as
MinAtar's, and an episode depends on its seed alone, whichever lane or chunk plays it."""

from __future__ import annotations

import numpy as np
import pytest

from compress_dqn.envs.environment import make_env_from, probe_env, reset_episode
from compress_dqn.envs.episodes import play_side_by_side, random_returns, run_episodes
from compress_dqn.envs import lanes as lanes_module
from compress_dqn.envs.lanes import BreakoutLanes, GymLanes, SpaceInvadersLanes, make_lanes
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


def play_both(env: EnvConfig, seeds: list[int], width: int, pick, kind=BreakoutLanes, start=None) -> dict[str, int]:
    """Play `seeds` in numpy lanes of `kind` and, lane for lane, in MinAtar's own environments with
    the same actions; assert every observation, reward and end is the same. Counts of what was
    played. start(lanes, lane, own): called after each episode's start (a state set in both)."""
    lanes = make_lanes(env, width)
    assert isinstance(lanes, kind)
    wall = 3 if kind is BreakoutLanes else 1  # the channel that fills again: bricks, aliens
    own = [make_env_from(env, whole_games=True) for _ in range(width)]
    counts = {"steps": 0, "refills": 0, "truncated": 0, "episodes": 0}
    queue, live = list(seeds), []

    def begin(lane):
        lanes.start(lane, queue[0])
        assert np.array_equal(reset_episode(own[lane], queue.pop(0)), lanes.obs[lane])
        if start is not None:
            start(lanes, lane, own[lane])
            assert np.array_equal(own[lane].unwrapped.game.state().astype(np.uint8), lanes.obs[lane])

    for lane in range(width):
        begin(lane)
        live.append(lane)
    while live:
        actions = np.array([pick(lanes.obs[lane]) for lane in live])
        walls = lanes.obs[live, :, :, wall].sum(axis=(1, 2))
        rewards, ended = lanes.step(actions, np.array(live))
        still = []
        for k, lane in enumerate(live):
            obs, reward, terminated, truncated, _ = own[lane].step(int(actions[k]))
            assert np.array_equal(obs, lanes.obs[lane]) and obs.dtype == lanes.obs.dtype, (lane, counts)
            assert (float(reward), terminated or truncated) == (rewards[k], ended[k]), (lane, counts)
            counts["steps"] += 1
            counts["refills"] += int(lanes.obs[lane, :, :, wall].sum() > walls[k])
            counts["truncated"] += int(truncated and not terminated)
            if ended[k]:
                counts["episodes"] += 1
                if not queue:
                    continue
                begin(lane)
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


def hunter(obs: np.ndarray) -> int:
    """A Space Invaders player (no-op, left, right, fire): under the nearest alien column that no
    bullet of its own is flying up, firing, and out of the columns where the aliens' bullets come down."""
    pos = int(np.argmax(obs[9, :, 0]))
    moves = {0: pos, 1: max(pos - 1, 0), 2: min(pos + 1, 9), 3: pos}
    danger = obs[5:9, :, 5].any(axis=0) | obs[8:10, :, 1].any(axis=0)
    columns = np.flatnonzero(obs[:, :, 1].any(axis=0) & ~obs[:, :, 4].any(axis=0))
    want = 0
    if len(columns):
        target = columns[np.argmin(np.abs(columns - pos))]
        want = 3 if target == pos else (1 if target < pos else 2)
    return next((a for a in (want, 1, 2, 0) if not danger[moves[a]]), want)


def leave_aliens(columns: list[int], interval: int):
    """An episode's start with the wave's bottom-row aliens in `columns` left and the aliens' move
    interval set, in the numpy lanes and in MinAtar's own game alike. The aliens first move at
    step 13, by when a hunter near them has mostly shot them: a cleared wave, a new one, the speed
    ramping (or at its fastest, interval 6, staying there), soon and often."""

    def start(lanes, lane, own):
        game = own.unwrapped.game.env
        keep = np.zeros((10, 10), dtype=bool)
        keep[3, columns] = True
        game.alien_map = keep.astype(float)
        game.enemy_move_interval = interval
        lanes._aliens[lane] = keep
        lanes._state[lanes_module._INTERVAL, lane] = interval
        lanes._state[lanes_module._ALIENS, lane] = len(columns)
        lanes._show_aliens(np.array([lane]), np.array([-1]))

    return start


@pytest.mark.parametrize("draws", [None, 16])
def test_numpy_space_invaders_steps_as_minatars_space_invaders(draws, monkeypatch):
    """Random actions and a hunter that mostly tracks and fires; whole waves, and waves of a few
    aliens left, so that waves are cleared, new ones come and the aliens' speed ramps up to its
    fastest (interval 6) and stays; also with blocks of 16 draws (episodes longer than a block)."""
    if draws is not None:
        monkeypatch.setattr(lanes_module, "_DRAWS", draws)
    env = EnvConfig(id="MinAtar/SpaceInvaders-v1", max_episode_steps=10000)
    rng = np.random.default_rng(2)

    def mostly_hunting(obs):
        return hunter(obs) if rng.random() < 0.9 else int(rng.integers(4))

    counts = play_both(env, list(range(12)), 5, lambda obs: int(rng.integers(4)), SpaceInvadersLanes)
    assert counts["episodes"] == 12, counts
    counts = play_both(env, list(range(12)), 5, mostly_hunting, SpaceInvadersLanes)
    assert counts["episodes"] == 12, counts
    for interval in (7, 6):  # the ramp's last step, and its end
        counts = play_both(env, list(range(100, 112)), 6, mostly_hunting, SpaceInvadersLanes, leave_aliens([4, 5], interval))
        assert counts["episodes"] == 12 and counts["refills"] >= 6, counts


def test_numpy_space_invaders_with_its_options_the_full_action_set_and_a_step_limit():
    """No ramping, no sticky actions, the six actions of -v0, and gymnasium's TimeLimit."""
    rng = np.random.default_rng(3)
    plain = EnvConfig(id="MinAtar/SpaceInvaders-v1", kwargs={"difficulty_ramping": False, "sticky_action_prob": 0.0})
    counts = play_both(plain, list(range(12)), 4, hunter, SpaceInvadersLanes, leave_aliens([5, 6], 12))
    assert counts["refills"] >= 6, counts
    counts = play_both(EnvConfig(id="MinAtar/SpaceInvaders-v0"), list(range(12)), 5,
                       lambda obs: int(rng.integers(6)), SpaceInvadersLanes)
    assert counts["episodes"] == 12, counts
    counts = play_both(EnvConfig(id="MinAtar/SpaceInvaders-v1", max_episode_steps=25), list(range(12)), 5,
                       hunter, SpaceInvadersLanes)
    assert counts["truncated"] > 0, counts


def test_only_checked_minatar_games_get_numpy_lanes(monkeypatch):
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/SpaceInvaders-v1"), 2), SpaceInvadersLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/Breakout-v1"), 2), BreakoutLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/SpaceInvaders-v1", frame_stack=2), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/Breakout-v1", frame_stack=2), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/Asterix-v1"), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="CartPole-v1"), 2), GymLanes)
    monkeypatch.setattr(lanes_module, "_minatar_version", lambda: "1.0.16")  # a version not checked
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/SpaceInvaders-v1"), 2), GymLanes)
    assert isinstance(make_lanes(EnvConfig(id="MinAtar/Breakout-v1"), 2), GymLanes)


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
        return tracker(obs) if "Breakout" in env_id else hunter(obs)

    played = play_side_by_side(lambda batch, _: np.array([greedy(o) for o in batch]), env, seeds, width=6)
    assert played == run_episodes(greedy, env, seeds) == [run_episodes(greedy, env, [s])[0] for s in seeds]
