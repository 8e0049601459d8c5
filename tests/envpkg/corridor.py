"""Corridor-v0: walk right to the end of a corridor; a user's own environment, registered when imported.

Registered without a time limit (the product adds one), its observation a 2 x length float table
(row 0: where the walker is, row 1: the goal), flattened by the product as SB3's FlattenExtractor
does. `length` is its gymnasium.make keyword; `dict_obs=True` gives a Dict observation instead, `dtype`
another float type.
CORRIDOR_ONLY_IN (a process id): any other process that imports this module fails, as a worker
where the package is not installed would.
"""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium as gym
import numpy as np

if os.environ.get("CORRIDOR_ONLY_IN") not in (None, "", str(os.getpid())):
    raise ImportError("corridor: not importable in this process (CORRIDOR_ONLY_IN)")


class Corridor(gym.Env):
    """Actions: 0 left, 1 right. Reward 1 at the goal (the episode ends), -0.01 a step before."""

    def __init__(self, length: int = 8, dict_obs: bool = False, dtype: str = "float32") -> None:
        if length < 3:
            raise ValueError(f"length {length}: a corridor has at least 3 cells")
        self.length, self.dict_obs, self.dtype = int(length), dict_obs, np.dtype(dtype)
        table = gym.spaces.Box(0.0, 1.0, shape=(2, self.length), dtype=self.dtype)
        self.observation_space = gym.spaces.Dict({"table": table}) if dict_obs else table
        self.action_space = gym.spaces.Discrete(2)
        self.position = 0

    def _obs(self):
        table = np.zeros((2, self.length), self.dtype)
        table[0, self.position] = 1.0
        table[1, -1] = 1.0
        return {"table": table} if self.dict_obs else table

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(0, self.length // 2))
        return self._obs(), {}

    def step(self, action):
        self.position = int(np.clip(self.position + (1 if int(action) == 1 else -1), 0, self.length - 1))
        done = self.position == self.length - 1
        return self._obs(), 1.0 if done else -0.01, done, False, {}


class RewardScale(gym.RewardWrapper):
    """A user's wrapper: rewards times `scale`."""

    def __init__(self, env: gym.Env, scale: float = 1.0) -> None:
        super().__init__(env)
        self.scale = float(scale)

    def reward(self, reward):
        return self.scale * reward


def touch(env: gym.Env, path: str = "touched") -> gym.Env:
    """Not a wrapper class: a function with a side effect, which env.wrappers must never call."""
    Path(path).write_text("called")
    return env


gym.register(id="Corridor-v0", entry_point=Corridor)
