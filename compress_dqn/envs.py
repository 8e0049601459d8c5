"""Environments: gymnasium ids with kwargs, discrete actions only, seeded from the recipe.

Exact resume needs the environment's random state: for the classic-control and Box2D
environments an episode is fully determined by `env.unwrapped.np_random` at reset, so
`rng_state`/`set_rng_state` capture it as plain JSON-able data (no pickle).
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from compress_dqn.errors import UserError


@dataclass(frozen=True)
class EnvInfo:
    """What the network and the replay buffer need to know about an environment."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int


def _registered_ids() -> list[str]:
    return sorted(gym.envs.registry.keys())


def check_env_id(env_id: str) -> None:
    """Fail with a did-you-mean when the id is not registered (cheap: no environment is built)."""
    _import_env_packages(env_id)
    if env_id in gym.envs.registry:
        return
    close = difflib.get_close_matches(env_id, _registered_ids(), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.envs.registry for valid ids"
    raise UserError(f"env.id: {env_id!r} is not a registered gymnasium environment{hint}")


def _import_env_packages(env_id: str) -> None:
    """Atari ids live in ale-py, which registers them on import."""
    if env_id.startswith("ALE/"):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise UserError(f"env.id: {env_id!r} needs ale-py; pip install ale-py") from None


def make_env(
    env_id: str,
    kwargs: dict[str, Any] | None = None,
    max_episode_steps: int | None = None,
) -> gym.Env:
    """Build an environment and check it has a discrete action space."""
    check_env_id(env_id)
    options: dict[str, Any] = dict(kwargs or {})
    if max_episode_steps is not None:
        options["max_episode_steps"] = max_episode_steps
    try:
        env = gym.make(env_id, **options)
    except gym.error.DependencyNotInstalled as exc:
        raise UserError(f"env.id: {env_id!r} needs an extra package: {str(exc).splitlines()[0]}") from None
    except TypeError as exc:
        raise UserError(f"env.kwargs: {env_id!r} rejected them: {exc}") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        space = env.action_space
        env.close()
        raise UserError(
            f"env.id: {env_id!r} has action space {space}; DQN needs a Discrete action space "
            "(pick a discrete variant, e.g. LunarLander-v3 instead of continuous=True)"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        space = env.observation_space
        env.close()
        raise UserError(f"env.id: {env_id!r} has observation space {space}; only Box observations are supported")
    return env


def env_info(env: gym.Env, env_id: str) -> EnvInfo:
    """Shapes and sizes of an environment built by make_env."""
    space = env.observation_space
    return EnvInfo(
        env_id=env_id,
        obs_shape=tuple(int(d) for d in space.shape),
        obs_dtype=np.dtype(space.dtype),
        n_actions=int(env.action_space.n),
    )


def seed_env(env: gym.Env, seed: int) -> np.ndarray:
    """Seed the environment and its action space; returns the first observation."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    return obs


def rng_state(env: gym.Env) -> str:
    """The environment's random state as a JSON string (for checkpoints)."""
    return json.dumps(env.unwrapped.np_random.bit_generator.state)


def set_rng_state(env: gym.Env, state: str) -> None:
    """Restore a state captured by rng_state, so the next reset() continues the same stream."""
    data = json.loads(state)
    bit_generator = getattr(np.random, data["bit_generator"])()
    bit_generator.state = data
    env.unwrapped.np_random = np.random.Generator(bit_generator)
