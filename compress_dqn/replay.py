"""Preallocated replay buffer for DQN with a byte budget.

The design follows Stable-Baselines3's ``buffers.py`` (preallocated numpy
arrays, a ``NamedTuple`` of samples, a psutil memory check) with one change
that matters for image observations: each observation is stored once.  A
transition's next observation is simply the next row of the ring, so a
stream of transitions costs one row each plus one extra row per episode end,
instead of two full observations per transition.

Row layout (``capacity`` rows in a ring)::

    obs[i]      observation, native dtype (float32, uint8, ...)
    actions[i]  action taken in obs[i] (smallest unsigned dtype that fits)
    rewards[i]  reward of that action (float32)
    flags[i]    VALID | TERMINATED | TRUNCATED bitfield (uint8)

Row ``i`` is a sampleable transition start (VALID) only while row
``(i + 1) % capacity`` still holds its next observation.  An episode's final
observation gets a row of its own that is never VALID.
"""

from __future__ import annotations

import json
import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import psutil

from compress_dqn.errors import UserError

__all__ = ["Batch", "ReplayBuffer", "VALID", "TERMINATED", "TRUNCATED"]

# Bits of the per-row ``flags`` byte.
VALID = np.uint8(1)  # row starts a transition; the next row is its next obs
TERMINATED = np.uint8(2)  # the transition ended the episode for real
TRUNCATED = np.uint8(4)  # the episode was cut off (time limit); still bootstraps

# Keep this share of available memory free when checking the allocation, so
# the buffer does not push the machine into swap or the OOM killer.
_MEMORY_MARGIN = 0.9

# Below this share of VALID rows, rejection sampling wastes too many draws and
# sample_indices enumerates the valid rows instead.  With this layout the share
# is normally about 50% or more, so the fallback is a safety net.
_MIN_VALID_FRACTION = 0.25

_STATE_ARRAYS = ("obs", "actions", "rewards", "flags")
_STATE_SCALARS = ("position", "size", "num_transitions", "episode_open", "last_row")


class Batch(NamedTuple):
    """A batch of transitions, ready for a DQN loss.

    ``terminated`` is 1.0 only where the episode really terminated: truncated
    transitions keep 0.0 so their target still bootstraps from the next state.
    """

    observations: np.ndarray  # (B, *obs_shape), the buffer's obs dtype
    actions: np.ndarray  # (B,) int64
    rewards: np.ndarray  # (B,) float32
    next_observations: np.ndarray  # (B, *obs_shape), the buffer's obs dtype
    terminated: np.ndarray  # (B,) float32


def _format_bytes(n: float) -> str:
    """Human-readable size with binary units, for error messages."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024.0:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024.0
    return f"{n:.2f} TiB"


def _action_dtype(n_actions: int) -> np.dtype:
    """Smallest unsigned dtype that holds actions 0 .. n_actions - 1."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if n_actions - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"n_actions={n_actions} is too large (at most 2**32)")


def _check_positive_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _normalize_shape(obs_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in obs_shape)
    except TypeError:
        raise ValueError(f"obs_shape must be a tuple of ints, got {obs_shape!r}") from None
    if any(d < 1 for d in shape):
        raise ValueError(f"obs_shape dimensions must be >= 1, got {shape}")
    return shape


class ReplayBuffer:
    """Ring buffer of transitions that stores every observation once.

    :param capacity: number of rows (roughly transitions; each episode end
        costs one extra row for its final observation). At least 2.
    :param obs_shape: shape of one observation.
    :param obs_dtype: dtype observations are stored in (keep uint8 images as
        uint8: that is what makes large buffers fit).
    :param n_actions: number of discrete actions (picks the action dtype).
    :param seed: seed of the sampling generator.
    :raises UserError: if the buffer does not fit in available memory.
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        n_actions: int,
        seed: int,
    ) -> None:
        self._capacity = _check_positive_int("capacity", capacity, 2)
        self._n_actions = _check_positive_int("n_actions", n_actions, 1)
        self._obs_shape = _normalize_shape(obs_shape)
        self._obs_dtype = np.dtype(obs_dtype)
        self._action_dtype = _action_dtype(self._n_actions)

        # Check before allocating: failing with a clear message beats a
        # MemoryError (or the OOM killer) halfway through filling the arrays.
        row_bytes = self.bytes_per_row(self._obs_shape, self._obs_dtype, self._n_actions)
        total = self._capacity * row_bytes
        available = psutil.virtual_memory().available
        if total > _MEMORY_MARGIN * available:
            raise UserError(
                f"replay buffer needs {_format_bytes(total)} "
                f"({self._capacity} transitions x {_format_bytes(row_bytes)}) "
                f"but only {_format_bytes(available)} of memory is available "
                f"(at most {_MEMORY_MARGIN:.0%} of it is used); "
                "lower train.buffer_size or set replay.memory"
            )

        # np.empty + fill(0) rather than np.zeros: zeros may hand back lazily
        # mapped pages, so RSS would creep up as the buffer fills and an
        # out-of-memory failure would come hours into training, not now.
        self._obs = self._alloc((self._capacity, *self._obs_shape), self._obs_dtype)
        self._actions = self._alloc((self._capacity,), self._action_dtype)
        self._rewards = self._alloc((self._capacity,), np.dtype(np.float32))
        self._flags = self._alloc((self._capacity,), np.dtype(np.uint8))

        self._pos = 0  # next row to write
        self._size = 0  # rows written so far, at most capacity
        self._num_valid = 0  # VALID rows, kept up to date on every write
        self._episode_open = False  # last add did not end its episode
        self._last_row = -1  # row holding the last add's next_obs
        self._last_next_obs: Any = None  # that next_obs object (identity fast path)
        self._rng = np.random.default_rng(seed)

    @staticmethod
    def _alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        arr = np.empty(shape, dtype=dtype)
        arr.fill(0)  # touch every page now so the memory is committed up front
        return arr

    # ------------------------------------------------------------------ sizes

    @staticmethod
    def bytes_per_row(
        obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int
    ) -> int:
        """Exact bytes one row costs (obs + action + reward + flags)."""
        shape = _normalize_shape(obs_shape)
        obs_bytes = math.prod(shape) * np.dtype(obs_dtype).itemsize
        action_bytes = _action_dtype(_check_positive_int("n_actions", n_actions, 1)).itemsize
        return obs_bytes + action_bytes + np.dtype(np.float32).itemsize + np.dtype(np.uint8).itemsize

    @classmethod
    def capacity_for_budget(
        cls,
        budget_bytes: int,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        n_actions: int,
    ) -> int:
        """Rows that fit in ``budget_bytes``, so users can size by memory.

        :raises UserError: if fewer than 2 rows (one transition) fit.
        """
        row_bytes = cls.bytes_per_row(obs_shape, obs_dtype, n_actions)
        rows = int(budget_bytes) // row_bytes if budget_bytes > 0 else 0
        if rows < 2:
            raise UserError(
                f"replay memory budget of {_format_bytes(budget_bytes)} ({int(budget_bytes)} bytes) "
                f"holds {rows} rows but the buffer needs at least 2 "
                f"({_format_bytes(row_bytes)} = {row_bytes} bytes per transition); "
                "raise replay.memory"
            )
        return rows

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the buffer's arrays."""
        return int(
            self._obs.nbytes + self._actions.nbytes + self._rewards.nbytes + self._flags.nbytes
        )

    @property
    def capacity(self) -> int:
        """Number of rows in the ring."""
        return self._capacity

    @property
    def size(self) -> int:
        """Rows written so far (at most ``capacity``)."""
        return self._size

    @property
    def num_transitions(self) -> int:
        """Transitions that can be sampled right now (VALID rows)."""
        return self._num_valid

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self._obs_shape

    @property
    def obs_dtype(self) -> np.dtype:
        return self._obs_dtype

    @property
    def n_actions(self) -> int:
        return self._n_actions

    # ----------------------------------------------------------------- adding

    def _write_row(self, x: np.ndarray) -> int:
        """Write an observation into the next ring row and return its index.

        Overwriting row j destroys the transition starting at j (its obs is
        gone) and the one starting at j-1 (its next obs is gone).  When j is
        written as the next obs of j-1 in the same add, the caller sets j-1's
        VALID bit afterwards, so clearing it here is harmless.
        """
        j = self._pos
        if self._flags[j] & VALID:
            self._num_valid -= 1
        self._flags[j] = 0
        prev = j - 1 if j > 0 else self._capacity - 1
        if self._flags[prev] & VALID:
            self._flags[prev] &= ~VALID
            self._num_valid -= 1
        self._obs[j] = x
        self._pos = j + 1 if j + 1 < self._capacity else 0
        if self._size < self._capacity:
            self._size += 1
        return j

    def _continues_episode(self, obs: Any) -> bool:
        """Whether ``obs`` is the previous add's next_obs, already stored."""
        if not self._episode_open or self._last_row < 0:
            return False
        if obs is self._last_next_obs:
            return True
        stored = self._obs[self._last_row]
        candidate = np.asarray(obs)
        if candidate.shape != stored.shape:
            return False
        # Compare in storage dtype: a float64 copy of a float32 obs is the same obs.
        candidate = candidate.astype(self._obs_dtype, copy=False)
        equal_nan = self._obs_dtype.kind in "fc"
        return bool(np.array_equal(candidate, stored, equal_nan=equal_nan))

    def _check_obs(self, name: str, x: Any) -> None:
        shape = np.shape(x)
        if shape != self._obs_shape:
            raise ValueError(f"{name} has shape {shape}, expected {self._obs_shape}")

    def add(
        self,
        obs: np.ndarray,
        action: int,
        reward: float,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
    ) -> None:
        """Store one transition.

        When ``obs`` is the previous add's ``next_obs`` (same object, or equal
        values) and that add did not end the episode, the stored row is reused
        so consecutive transitions share observations.  Unrelated transitions
        (e.g. loaded from a file) each take two rows.

        Observations are copied, but the identity fast path assumes the caller
        does not modify a passed ``next_obs`` in place before the next add.
        """
        self._check_obs("obs", obs)
        self._check_obs("next_obs", next_obs)
        a = int(action)
        if not 0 <= a < self._n_actions:
            raise ValueError(f"action {a} is out of range [0, {self._n_actions})")

        if self._continues_episode(obs):
            obs_row = self._last_row
        else:
            obs_row = self._write_row(obs)
        next_row = self._write_row(next_obs)  # always (obs_row + 1) % capacity

        flags = VALID
        if terminated:
            flags |= TERMINATED
        if truncated:
            flags |= TRUNCATED
        self._actions[obs_row] = a
        self._rewards[obs_row] = reward
        self._flags[obs_row] = flags
        self._num_valid += 1

        self._last_row = next_row
        self._episode_open = not (terminated or truncated)
        self._last_next_obs = next_obs if self._episode_open else None

    # --------------------------------------------------------------- sampling

    def sample_indices(self, n: int) -> np.ndarray:
        """``n`` VALID row indices, uniform with replacement.

        Rejection sampling over ``[0, size)`` avoids building the list of valid
        rows on every call; VALID rows are normally the large majority.

        :raises ValueError: if there is nothing to sample.
        """
        n = int(n)
        if n < 0:
            raise ValueError(f"cannot sample {n} transitions")
        if self._num_valid == 0:
            raise ValueError("replay buffer has no complete transitions to sample")
        out = np.empty(n, dtype=np.int64)
        filled = 0
        fraction = self._num_valid / self._size
        while filled < n:
            need = n - filled
            if fraction < _MIN_VALID_FRACTION:
                valid = np.flatnonzero(self._flags[: self._size] & VALID)
                out[filled:] = valid[self._rng.integers(0, valid.size, size=need)]
                break
            # Draw ~10% more than the expected requirement so one round is
            # usually enough; keeping the first `need` valid draws stays uniform.
            draw = int(need / fraction * 1.1) + 8
            idx = self._rng.integers(0, self._size, size=draw)
            keep = idx[(self._flags[idx] & VALID) != 0][:need]
            out[filled : filled + keep.size] = keep
            filled += keep.size
        return out

    def gather(self, indices: npt.ArrayLike) -> Batch:
        """Build a batch from VALID row indices (vectorised, no per-row loop).

        :raises ValueError: if an index is not a VALID row.
        """
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
        flags = self._flags[idx]
        if not np.all(flags & VALID):
            raise ValueError("gather got indices that are not valid transitions")
        next_idx = idx + 1
        next_idx[next_idx == self._capacity] = 0
        return Batch(
            observations=self._obs[idx],
            actions=self._actions[idx].astype(np.int64),
            rewards=self._rewards[idx],
            next_observations=self._obs[next_idx],
            terminated=((flags & TERMINATED) != 0).astype(np.float32),
        )

    def sample(self, batch_size: int) -> Batch:
        """Uniform batch of transitions.

        For several minibatches at once, sample ``batch_size * k`` and reshape:
        one gather is much cheaper than k.
        """
        return self.gather(self.sample_indices(batch_size))

    def sample_observations(self, n: int) -> np.ndarray:
        """n observations from uniformly sampled transitions, without gathering the rest of the
        batch (calibration and distillation need states only). Draws exactly as sample(n) does."""
        return self._obs[self.sample_indices(n)]

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays.

        Suitable for ``np.savez`` and ``np.load(..., allow_pickle=False)``: the
        generator state is a JSON string in a 0-d unicode array, not a pickle.
        """
        return {
            "obs": self._obs,
            "actions": self._actions,
            "rewards": self._rewards,
            "flags": self._flags,
            "position": np.array(self._pos, dtype=np.int64),
            "size": np.array(self._size, dtype=np.int64),
            "num_transitions": np.array(self._num_valid, dtype=np.int64),
            "episode_open": np.array(self._episode_open, dtype=np.bool_),
            "last_row": np.array(self._last_row, dtype=np.int64),
            "rng_state": np.array(json.dumps(self._rng.bit_generator.state)),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore from :meth:`state_dict` into this (same-shaped) buffer.

        Arrays are copied into the existing preallocated ones so memory stays
        committed and no reference to the loaded file is kept.

        :raises ValueError: if the state does not match this buffer.
        """
        missing = [k for k in (*_STATE_ARRAYS, *_STATE_SCALARS, "rng_state") if k not in state]
        if missing:
            raise ValueError(f"replay state is missing {', '.join(missing)}")
        for key in _STATE_ARRAYS:
            src = np.asarray(state[key])
            dst = getattr(self, f"_{key}")
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(
                    f"replay state {key!r} is {src.dtype}{src.shape}, "
                    f"this buffer expects {dst.dtype}{dst.shape}"
                )
        pos = int(state["position"])
        size = int(state["size"])
        num_valid = int(state["num_transitions"])
        last_row = int(state["last_row"])
        episode_open = bool(state["episode_open"])
        if not (0 <= size <= self._capacity and 0 <= pos < self._capacity):
            raise ValueError(f"replay state has position {pos} / size {size} outside capacity {self._capacity}")
        if not -1 <= last_row < self._capacity:
            raise ValueError(f"replay state has last_row {last_row} outside capacity {self._capacity}")
        counted = int(np.count_nonzero(np.asarray(state["flags"]) & VALID))
        if counted != num_valid:
            raise ValueError(f"replay state says {num_valid} transitions but its flags hold {counted}")
        rng_state = json.loads(str(np.asarray(state["rng_state"])[()]))

        self._rng.bit_generator.state = rng_state
        for key in _STATE_ARRAYS:
            np.copyto(getattr(self, f"_{key}"), state[key])
        self._pos = pos
        self._size = size
        self._num_valid = num_valid
        self._episode_open = episode_open
        self._last_row = last_row
        # The object is gone; _continues_episode falls back to comparing values.
        self._last_next_obs = None
