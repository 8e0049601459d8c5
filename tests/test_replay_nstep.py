"""n-step returns from the replay ring: sums, early stops at episode ends and at the newest row."""

from __future__ import annotations

import numpy as np
import pytest

from compress_dqn.replay.buffer import ReplayBuffer

GAMMA = 0.9


def episode(buf: ReplayBuffer, episode_id: int, rewards: list[float], end: str) -> None:
    """obs = [t, episode_id]; the last transition terminates, truncates or stays open ('open')."""
    for t, reward in enumerate(rewards):
        last = t == len(rewards) - 1
        buf.add(np.array([t, episode_id], np.float32), t % 2, reward, np.array([t + 1, episode_id], np.float32),
                last and end == "term", last and end == "trunc")


def rows_of(buf: ReplayBuffer) -> dict[tuple[int, int], int]:
    """Row index of each stored transition, keyed by its observation."""
    batch = buf.gather(np.flatnonzero(buf._flags[: buf.size] & 1))
    valid = np.flatnonzero(buf._flags[: buf.size] & 1)
    return {(int(o[0]), int(o[1])): int(i) for o, i in zip(batch.observations, valid)}


@pytest.fixture
def buf() -> ReplayBuffer:
    b = ReplayBuffer(64, (2,), np.float32, 2, seed=0)
    episode(b, 0, [1.0, 2.0, 3.0, 4.0, 5.0], "term")
    episode(b, 1, [10.0, 20.0, 30.0], "trunc")
    episode(b, 2, [100.0, 200.0], "open")
    return b


def test_full_n_step_sum_and_bootstrap_observation(buf):
    rows = rows_of(buf)
    b = buf.gather_n_step([rows[(0, 0)]], 3, GAMMA)
    assert b.rewards[0] == pytest.approx(1 + GAMMA * 2 + GAMMA**2 * 3)
    np.testing.assert_array_equal(b.next_observations[0], [3, 0])
    assert b.terminated[0] == 0 and b.discounts[0] == pytest.approx(GAMMA**3)
    np.testing.assert_array_equal(b.observations[0], [0, 0])
    assert b.actions[0] == 0


def test_stops_at_termination_without_bootstrap(buf):
    b = buf.gather_n_step([rows_of(buf)[(3, 0)]], 3, GAMMA)
    assert b.rewards[0] == pytest.approx(4 + GAMMA * 5)  # never the next episode's 10
    assert b.terminated[0] == 1 and b.discounts[0] == 0


def test_stops_at_truncation_and_bootstraps_from_the_final_observation(buf):
    b = buf.gather_n_step([rows_of(buf)[(1, 1)]], 5, GAMMA)
    assert b.rewards[0] == pytest.approx(20 + GAMMA * 30)
    np.testing.assert_array_equal(b.next_observations[0], [3, 1])
    assert b.terminated[0] == 0 and b.discounts[0] == pytest.approx(GAMMA**2)


def test_stops_at_the_newest_stored_transition(buf):
    b = buf.gather_n_step([rows_of(buf)[(0, 2)]], 4, GAMMA)
    assert b.rewards[0] == pytest.approx(100 + GAMMA * 200)
    np.testing.assert_array_equal(b.next_observations[0], [2, 2])
    assert b.discounts[0] == pytest.approx(GAMMA**2)


def test_one_step_equals_gather(buf):
    idx = buf.sample_indices(50)
    one, plain = buf.gather_n_step(idx, 1, GAMMA), buf.gather(idx)
    for name in ("observations", "actions", "rewards", "next_observations", "terminated"):
        np.testing.assert_array_equal(getattr(one, name), getattr(plain, name))
    np.testing.assert_array_equal(one.discounts, (np.float32(GAMMA) * (1 - plain.terminated)).astype(np.float32))


def test_ring_wrap_and_frame_stacks():
    """Across the ring's end, with stacked frames: the bootstrap stack is rebuilt from its rows."""
    k = 3
    b = ReplayBuffer(8, (1, k), np.float32, 2, seed=0, frame_stack=k)
    frames = np.arange(20, dtype=np.float32)
    stack = lambda t: frames[[max(t - 2, 0), max(t - 1, 0), t]].reshape(1, k)  # noqa: E731
    for t in range(12):  # one long episode: rows wrap around the 8-row ring
        b.add(stack(t), 0, float(t), stack(t + 1), False, False)
    valid = np.flatnonzero(b._flags[: b.size] & 1)
    first_obs = b.gather(valid).observations[:, 0, -1]
    start = valid[np.argmin(first_obs)]
    t0 = int(first_obs.min())
    out = b.gather_n_step([start], 3, GAMMA)
    assert out.rewards[0] == pytest.approx(t0 + GAMMA * (t0 + 1) + GAMMA**2 * (t0 + 2))
    np.testing.assert_array_equal(out.next_observations[0], stack(t0 + 3))
    assert out.discounts[0] == pytest.approx(GAMMA**3)


def test_bad_n_steps_is_refused(buf):
    with pytest.raises(ValueError, match="n_steps"):
        buf.gather_n_step([0], 0, GAMMA)
