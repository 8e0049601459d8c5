import numpy as np
import pytest

from compress_dqn.envs.environment import env_info, make_env, rng_state, seed_env, set_rng_state
from compress_dqn.errors import UserError


def test_unknown_id_suggests_a_close_one():
    with pytest.raises(UserError, match="did you mean CartPole-v1"):
        make_env("CartPol-v1")


def test_continuous_actions_rejected():
    with pytest.raises(UserError, match="Discrete action space"):
        make_env("Pendulum-v1")


def test_info_and_kwargs():
    env = make_env("CartPole-v1", max_episode_steps=10)
    info = env_info(env, "CartPole-v1")
    assert info.obs_shape == (4,) and info.n_actions == 2 and info.obs_dtype == np.float32
    seed_env(env, 0)
    steps = 0
    while True:
        _, _, terminated, truncated, _ = env.step(0 if steps % 2 else 1)
        steps += 1
        if terminated or truncated:
            break
    assert steps <= 10


def test_seeding_is_deterministic_and_rng_state_round_trips():
    a, b = make_env("CartPole-v1"), make_env("CartPole-v1")
    assert np.array_equal(seed_env(a, 7), seed_env(b, 7))
    state = rng_state(a)
    first, _ = a.reset()
    set_rng_state(b, state)
    second, _ = b.reset()
    assert np.array_equal(first, second)
