"""Turns added transitions into ring rows, storing each observation once.

A transition whose obs is the previous add's next_obs (same object, or equal values) and whose
episode goes on reuses that row; any other obs starts a fresh history (its first row START), so
unrelated transitions (e.g. loaded from a file) each take two rows, or with frame stacks up to
k + 1 when the older frames are not copies of the oldest one.  The next obs always takes the next
row, so row ``i``'s next observation is row ``i + 1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.replay.frames import Rows, history_frames, next_frame, stacks_at
from compress_dqn.replay.index import TransitionIndex
from compress_dqn.replay.packed import PackedFrames
from compress_dqn.replay.ring import Ring

__all__ = ["TransitionWriter"]


class TransitionWriter:
    """Writes transitions into ``ring`` (fields obs, actions, rewards, flags) and flags them in
    ``index``; ``obs_shape`` is the full observation (a stack when ``index.k > 1``). With
    ``frames`` (compressed rows) the observations go there instead of the ring's obs field."""

    def __init__(self, ring: Ring, index: TransitionIndex, obs_shape: tuple[int, ...], n_actions: int,
                 frames: PackedFrames | None = None) -> None:
        self._ring = ring
        self._index = index
        self._actions, self._rewards = ring["actions"], ring["rewards"]
        self._obs: Rows = frames if frames is not None else ring["obs"]
        self._flags = ring["flags"]
        self._k = index.k
        self._obs_shape = obs_shape
        self._n_actions = n_actions
        self._obs_dtype = self._obs.dtype
        self._equal_nan = self._obs_dtype.kind in "fc"
        self.last_next_obs: Any = None  # the last add's next_obs object (identity fast path)

    def _as_stored(self, x: Any) -> np.ndarray:
        # Compare in storage dtype: a float64 copy of a float32 obs is the same obs.
        return np.asarray(x).astype(self._obs_dtype, copy=False)

    def _equal(self, a: np.ndarray, b: np.ndarray) -> bool:
        return bool(np.array_equal(a, b, equal_nan=self._equal_nan))

    def _write_row(self, x: np.ndarray, start: bool) -> int:
        """Write an observation (or frame) into the next ring row and return its index."""
        j = self._ring.pos
        self._index.overwrite(j, start)
        if isinstance(self._obs, np.ndarray):
            self._obs[j] = x
        else:  # rows evicted to keep the byte budget lose their transitions as overwritten ones do
            for row in self._obs.write(j, x):
                self._index.overwrite(row, start=False)
        self._ring.advance()
        return j

    def _continues_episode(self, obs: Any) -> bool:
        """Whether ``obs`` is the previous add's next_obs, already stored.

        With frame stacks the whole rebuilt stack must match, not just the
        newest frame, or the stored history would not be the given obs.
        """
        last_row = self._index.last_row
        if not self._index.episode_open or last_row < 0:
            return False
        if obs is self.last_next_obs:
            return True
        stored = stacks_at(self._obs, self._flags, np.array([last_row], dtype=np.int64), self._k)[0]
        candidate = np.asarray(obs)
        return candidate.shape == stored.shape and self._equal(self._as_stored(candidate), stored)

    def _write_history(self, obs: Any) -> int:
        """Write ``obs`` as a fresh history (first row START); return its newest row."""
        frames = history_frames(self._as_stored(obs), self._k, self._equal)
        row = self._write_row(frames[0], start=True)
        for frame in frames[1:]:
            row = self._write_row(frame, start=False)
        return row

    def _check(self, obs: Any, action: int, next_obs: Any) -> int:
        """The action as an int, after checking shapes and range (before anything is written)."""
        if np.shape(obs) != self._obs_shape or np.shape(next_obs) != self._obs_shape:
            name, x = ("obs", obs) if np.shape(obs) != self._obs_shape else ("next_obs", next_obs)
            raise ValueError(f"{name} has shape {np.shape(x)}, expected {self._obs_shape}")
        a = int(action)
        if not 0 <= a < self._n_actions:
            raise ValueError(f"action {a} is out of range [0, {self._n_actions})")
        return a

    def add(self, obs: Any, action: int, reward: float, next_obs: Any, terminated: bool, truncated: bool) -> None:
        """Store one transition (see ``ReplayBuffer.add``).

        :raises ValueError: on a wrong shape, an out-of-range action or a next_obs that is not
            obs shifted by one frame; nothing is written then.
        """
        a = self._check(obs, action, next_obs)
        if self._k == 1:
            new_frame = next_obs
        else:
            new_frame = next_frame(self._as_stored(obs), self._as_stored(next_obs), self._k, self._equal)
        obs_row = self._index.last_row if self._continues_episode(obs) else self._write_history(obs)
        next_row = self._write_row(new_frame, start=False)  # always (obs_row + 1) % capacity
        self._actions[obs_row] = a
        self._rewards[obs_row] = reward
        self._index.mark(obs_row, next_row, terminated, truncated)
        self.last_next_obs = next_obs if self._index.episode_open else None
