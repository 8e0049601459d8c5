"""Preallocated replay buffer for DQN with a byte budget.

The design follows Stable-Baselines3's ``buffers.py`` (preallocated numpy
arrays, a ``NamedTuple`` of samples, a psutil memory check) with one change
that matters for image observations: each observation is stored once.  A
transition's next observation is simply the next row of the ring, so a
stream of transitions costs one row each plus one extra row per episode end,
instead of two full observations per transition.

Row layout (``capacity`` rows in a ring)::

    obs[i]      observation, native dtype (float32, uint8, ...); with
                frame_stack=k > 1, only the newest frame of the stack
    actions[i]  action taken in obs[i] (smallest unsigned dtype that fits)
    rewards[i]  reward of that action (float32)
    flags[i]    VALID | TERMINATED | TRUNCATED | START bitfield (uint8)

Row ``i`` is a sampleable transition start (VALID) only while row
``(i + 1) % capacity`` still holds its next observation.  An episode's final
observation gets a row of its own that is never VALID.

Frame stacking (``frame_stack=k > 1``, Atari style): observations are
channels-last stacks ``(..., k)`` with the newest frame last, and a row holds
one frame, so a transition costs one frame instead of k (or 2k).  The stack of
row ``i`` is rebuilt at sample time from rows ``i-k+1 .. i``, except that the
walk back stops at a START row (the first row of a stored history) and repeats
its frame.  That is exactly how a frame-stack wrapper pads a fresh episode
with copies of its reset frame, so stacks never cross an episode boundary and
a reset stack costs one row.  A stack whose older frames would not be rebuilt
that way (unrelated transitions, other padding) is stored exactly by writing
its older frames as extra non-VALID rows first.  Writing a row destroys the
oldest frame of the up to k-1 following rows' stacks, so those transitions
lose VALID as the ring overwrites them.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import psutil

from compress_dqn.errors import UserError

__all__ = ["Batch", "ReplayBuffer", "VALID", "TERMINATED", "TRUNCATED", "START", "format_bytes"]

# Bits of the per-row ``flags`` byte.
VALID = np.uint8(1)  # row starts a transition; the next row is its next obs
TERMINATED = np.uint8(2)  # the transition ended the episode for real
TRUNCATED = np.uint8(4)  # the episode was cut off (time limit); still bootstraps
START = np.uint8(8)  # row begins a stored history: stacks do not reach behind it

_NOT_VALID = np.uint8(~VALID & 0xFF)

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
    discounts: np.ndarray | None = None  # (B,) float32 gamma**m * (1 - terminated), n-step batches only


def format_bytes(n: float, decimals: int = 2) -> str:
    """Human-readable size with binary units, for error messages."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024.0:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{decimals}f} {unit}"
        n /= 1024.0
    return f"{n:.{decimals}f} TiB"


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


def _frame_shape(obs_shape: tuple[int, ...], frame_stack: int) -> tuple[int, ...]:
    """Shape of one stored row: the whole obs, or one frame of a channels-last stack."""
    if frame_stack == 1:
        return obs_shape
    if not obs_shape or obs_shape[-1] != frame_stack:
        raise ValueError(
            f"frame_stack={frame_stack} needs obs_shape with the stack on the last axis "
            f"(..., {frame_stack}), got obs_shape={obs_shape}; pass channels-last stacks "
            "or frame_stack=1"
        )
    return obs_shape[:-1]


class ReplayBuffer:
    """Ring buffer of transitions that stores every observation once.

    :param capacity: number of rows (roughly transitions; each episode end
        costs one extra row for its final observation). At least 2, and at
        least ``frame_stack + 1`` (one transition's stacks need that many rows).
    :param obs_shape: shape of one observation (with ``frame_stack=k > 1``, a
        channels-last stack ``(..., k)``, newest frame last).
    :param obs_dtype: dtype observations are stored in (keep uint8 images as
        uint8: that is what makes large buffers fit).
    :param n_actions: number of discrete actions (picks the action dtype).
    :param seed: seed of the sampling generator.
    :param frame_stack: frames per observation stack; rows then hold single
        frames and stacks are rebuilt at sample time (see the module docstring).
    :param memmap_path: if set, the observation/frame array is an ``np.memmap``
        scratch file there (created or overwritten, left in place afterwards),
        trading RAM for disk and page cache: the OS keeps hot pages cached and
        evicts the rest.  Its disk space is reserved up front.  Not a
        checkpoint: use :meth:`state_dict` for that.
    :raises UserError: if the buffer does not fit in available memory (or the
        memmap file does not fit on its disk).
    """

    def __init__(
        self,
        capacity: int,
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        n_actions: int,
        seed: int | np.random.SeedSequence,
        *,
        frame_stack: int = 1,
        memmap_path: str | os.PathLike[str] | None = None,
    ) -> None:
        self._capacity = _check_positive_int("capacity", capacity, 2)
        self._n_actions = _check_positive_int("n_actions", n_actions, 1)
        self._k = _check_positive_int("frame_stack", frame_stack, 1)
        self._obs_shape = _normalize_shape(obs_shape)
        self._frame_shape = _frame_shape(self._obs_shape, self._k)
        if self._capacity < self._k + 1:
            raise ValueError(
                f"capacity={self._capacity} is too small for frame_stack={self._k}: one "
                f"transition needs up to {self._k + 1} rows; use capacity >= {self._k + 1}"
            )
        self._obs_dtype = np.dtype(obs_dtype)
        self._action_dtype = _action_dtype(self._n_actions)
        self._equal_nan = self._obs_dtype.kind in "fc"
        self._memmap_path = None if memmap_path is None else Path(memmap_path)

        # Check before allocating: failing with a clear message beats a
        # MemoryError (or the OOM killer) halfway through filling the arrays.
        row_bytes = self.bytes_per_row(
            self._obs_shape, self._obs_dtype, self._n_actions, frame_stack=self._k
        )
        frame_bytes = math.prod(self._frame_shape) * self._obs_dtype.itemsize
        in_ram_row = row_bytes - frame_bytes if self._memmap_path is not None else row_bytes
        total = self._capacity * in_ram_row
        available = psutil.virtual_memory().available
        if total > _MEMORY_MARGIN * available:
            raise UserError(
                f"replay buffer needs {format_bytes(total)} "
                f"({self._capacity} transitions x {format_bytes(in_ram_row)}) "
                f"but only {format_bytes(available)} of memory is available "
                f"(at most {_MEMORY_MARGIN:.0%} of it is used); "
                "lower train.buffer_size or set replay.memory"
            )

        # np.empty + fill(0) rather than np.zeros: zeros may hand back lazily
        # mapped pages, so RSS would creep up as the buffer fills and an
        # out-of-memory failure would come hours into training, not now.
        obs_shape_rows = (self._capacity, *self._frame_shape)
        if self._memmap_path is None:
            self._obs = self._alloc(obs_shape_rows, self._obs_dtype)
        else:
            self._obs = self._alloc_memmap(self._memmap_path, obs_shape_rows, self._obs_dtype)
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

    @staticmethod
    def _alloc_memmap(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.memmap:
        """A zeroed memmap file whose disk blocks are reserved now.

        A sparse file would only run out of disk when a page is first written
        back, which kills the process with SIGBUS hours into training.
        """
        nbytes = math.prod(shape) * dtype.itemsize
        directory = path.parent
        if not directory.is_dir():
            raise UserError(f"replay memmap directory {directory} does not exist; create it or change memmap_path")
        existing = path.stat().st_size if path.is_file() else 0  # reused when overwritten
        free = shutil.disk_usage(directory).free
        if nbytes - existing > free:
            raise UserError(
                f"replay memmap file {path} needs {format_bytes(nbytes)} ({nbytes} bytes) "
                f"but only {format_bytes(free)} ({free} bytes) is free on {directory}; "
                "point memmap_path at a disk with more space or lower train.buffer_size"
            )
        with open(path, "w+b") as f:
            f.truncate(nbytes)
            if hasattr(os, "posix_fallocate"):
                try:
                    os.posix_fallocate(f.fileno(), 0, nbytes)
                except OSError as err:
                    if err.errno == errno.ENOSPC:
                        raise UserError(
                            f"replay memmap file {path} needs {format_bytes(nbytes)} but the disk "
                            f"of {directory} ran out of space reserving it; point memmap_path "
                            "at a disk with more space or lower train.buffer_size"
                        ) from None
                    # EINVAL/EOPNOTSUPP: this filesystem cannot reserve; go on sparse.
        return np.memmap(path, dtype=dtype, mode="r+", shape=shape)

    # ------------------------------------------------------------------ sizes

    @staticmethod
    def bytes_per_row(
        obs_shape: tuple[int, ...],
        obs_dtype: npt.DTypeLike,
        n_actions: int,
        *,
        frame_stack: int = 1,
    ) -> int:
        """Exact bytes one row costs (obs or one frame + action + reward + flags)."""
        k = _check_positive_int("frame_stack", frame_stack, 1)
        shape = _frame_shape(_normalize_shape(obs_shape), k)
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
        *,
        frame_stack: int = 1,
    ) -> int:
        """Rows that fit in ``budget_bytes``, so users can size by memory.

        :raises UserError: if fewer rows than one transition needs
            (2, or ``frame_stack + 1``) fit.
        """
        row_bytes = cls.bytes_per_row(obs_shape, obs_dtype, n_actions, frame_stack=frame_stack)
        minimum = max(2, int(frame_stack) + 1)
        rows = int(budget_bytes) // row_bytes if budget_bytes > 0 else 0
        if rows < minimum:
            raise UserError(
                f"replay memory budget of {format_bytes(budget_bytes)} ({int(budget_bytes)} bytes) "
                f"holds {rows} rows but the buffer needs at least {minimum} "
                f"({format_bytes(row_bytes)} = {row_bytes} bytes per transition); "
                "raise replay.memory"
            )
        return rows

    @property
    def nbytes(self) -> int:
        """Exact bytes held by the buffer's arrays (a memmap file's included)."""
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

    @property
    def frame_stack(self) -> int:
        """Frames per observation; 1 means whole observations are stored per row."""
        return self._k

    # ----------------------------------------------------------------- adding

    def _write_row(self, x: np.ndarray, start: bool) -> int:
        """Write an observation (or frame) into the next ring row and return its index.

        Overwriting row j destroys the transition starting at j (its obs is
        gone), the one starting at j-1 (its next obs is gone) and, with frame
        stacks, those starting at j+1 .. j+k-1 whose stack reaches back to j
        (none past a START row).  When j is written as the next obs of j-1 in
        the same add, the caller sets j-1's VALID bit afterwards, so clearing
        it here is harmless.
        """
        j = self._pos
        flags = self._flags
        if flags[j] & VALID:
            self._num_valid -= 1
        prev = j - 1 if j > 0 else self._capacity - 1
        if flags[prev] & VALID:
            flags[prev] &= _NOT_VALID
            self._num_valid -= 1
        for m in range(1, self._k):  # capacity > k, so these rows are not j or j-1
            r = j + m if j + m < self._capacity else j + m - self._capacity
            f = flags[r]
            if f & START:
                break
            if f & VALID:
                flags[r] = f & _NOT_VALID
                self._num_valid -= 1
        flags[j] = START if start else 0
        self._obs[j] = x
        self._pos = j + 1 if j + 1 < self._capacity else 0
        if self._size < self._capacity:
            self._size += 1
        return j

    def _as_stored(self, x: Any) -> np.ndarray:
        # Compare in storage dtype: a float64 copy of a float32 obs is the same obs.
        return np.asarray(x).astype(self._obs_dtype, copy=False)

    def _equal(self, a: np.ndarray, b: np.ndarray) -> bool:
        return bool(np.array_equal(a, b, equal_nan=self._equal_nan))

    def _continues_episode(self, obs: Any) -> bool:
        """Whether ``obs`` is the previous add's next_obs, already stored.

        With frame stacks the whole rebuilt stack must match, not just the
        newest frame, or the stored history would not be the given obs.
        """
        if not self._episode_open or self._last_row < 0:
            return False
        if obs is self._last_next_obs:
            return True
        if self._k == 1:
            stored = self._obs[self._last_row]
        else:
            row = np.array([self._last_row], dtype=np.int64)
            stored = self._stacks(self._frames(self._chain(row)))[0]
        candidate = np.asarray(obs)
        if candidate.shape != stored.shape:
            return False
        return self._equal(self._as_stored(candidate), stored)

    def _write_history(self, obs: Any) -> int:
        """Write ``obs`` as a fresh history (first row START); return its newest row.

        The rebuild repeats the START row's frame for older positions, so only
        frames from the end of the leading run of copies of the oldest frame
        need rows: one row for a reset stack of k copies, up to k otherwise.
        """
        x = self._as_stored(obs)
        if self._k == 1:
            return self._write_row(x, start=True)
        frames = np.moveaxis(x, -1, 0)  # (k, *frame_shape), oldest first
        first = 0
        while first + 1 < self._k and self._equal(frames[first + 1], frames[0]):
            first += 1
        row = self._write_row(frames[first], start=True)
        for t in range(first + 1, self._k):
            row = self._write_row(frames[t], start=False)
        return row

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
        (e.g. loaded from a file) each take two rows (with frame stacks, up to
        k + 1 when the older frames are not copies of the oldest one).

        With ``frame_stack=k > 1``, ``next_obs`` must be ``obs`` shifted by one
        frame (``next_obs[..., :-1] == obs[..., 1:]``), as a frame-stack wrapper
        gives: its stack is the next row's, rebuilt from obs's frames.

        Observations are copied, but the identity fast path assumes the caller
        does not modify a passed ``next_obs`` in place before the next add.

        :raises ValueError: on a wrong shape, an out-of-range action or a
            next_obs that is not obs shifted by one frame; nothing is written then.
        """
        self._check_obs("obs", obs)
        self._check_obs("next_obs", next_obs)
        a = int(action)
        if not 0 <= a < self._n_actions:
            raise ValueError(f"action {a} is out of range [0, {self._n_actions})")
        if self._k == 1:
            next_frame = next_obs
        else:
            nxt = self._as_stored(next_obs)
            x = self._as_stored(obs)
            # Frame by frame: one comparison of the strided (..., k-1) views is ~3x slower.
            if not all(self._equal(nxt[..., m], x[..., m + 1]) for m in range(self._k - 1)):
                raise ValueError(
                    f"with frame_stack={self._k}, next_obs must be obs shifted by one frame "
                    "(next_obs[..., :-1] == obs[..., 1:]) but its older frames differ; pass the "
                    "frame-stack wrapper's stacks (at an episode end, the final observation, "
                    "not the reset one)"
                )
            next_frame = nxt[..., -1]

        if self._continues_episode(obs):
            obs_row = self._last_row
        else:
            obs_row = self._write_history(obs)
        next_row = self._write_row(next_frame, start=False)  # always (obs_row + 1) % capacity

        flags = VALID
        if terminated:
            flags |= TERMINATED
        if truncated:
            flags |= TRUNCATED
        self._actions[obs_row] = a
        self._rewards[obs_row] = reward
        self._flags[obs_row] = (self._flags[obs_row] & START) | flags
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

    def _chain(self, idx: np.ndarray) -> list[np.ndarray]:
        """Rows of each stack, newest first: k-1 steps back, standing still at START rows."""
        rows = [idx]
        cur = idx
        for _ in range(self._k - 1):
            back = cur - 1
            back[back < 0] = self._capacity - 1
            cur = np.where(self._flags[cur] & START, cur, back)
            rows.append(cur)
        return rows

    def _frames(self, rows: list[np.ndarray]) -> list[np.ndarray]:
        return [self._obs[r] for r in rows]

    @staticmethod
    def _stacks(frames_newest_first: list[np.ndarray]) -> np.ndarray:
        return np.stack(frames_newest_first[::-1], axis=-1)

    def gather(self, indices: npt.ArrayLike) -> Batch:
        """Build a batch from VALID row indices (vectorised, no per-row loop).

        With frame stacks, the next stack reuses the obs stack's k-1 newest
        frames plus the next row's frame, so a batch reads k + 1 frames per row.

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
        if self._k == 1:
            observations = self._obs[idx]
            next_observations = self._obs[next_idx]
        else:
            frames = self._frames(self._chain(idx))
            observations = self._stacks(frames)
            next_observations = self._stacks([self._obs[next_idx], *frames[:-1]])
        return Batch(
            observations=observations,
            actions=self._actions[idx].astype(np.int64),
            rewards=self._rewards[idx],
            next_observations=next_observations,
            terminated=((flags & TERMINATED) != 0).astype(np.float32),
        )

    def gather_n_step(self, indices: npt.ArrayLike, n_steps: int, gamma: float) -> Batch:
        """n-step transitions from VALID rows (SB3's n_steps): up to n_steps rewards summed with
        discount gamma, stopping early at the episode's end or at the newest stored transition.

        ``next_observations`` is the observation the target bootstraps from (m <= n_steps rows
        later), ``terminated`` whether the episode terminated within those m steps, and
        ``discounts`` = gamma**m * (1 - terminated), the factor of the bootstrapped value. With
        n_steps=1 it is ``gather`` with discounts = gamma * (1 - terminated).

        :raises ValueError: if an index is not a VALID row or n_steps < 1.
        """
        if int(n_steps) < 1:
            raise ValueError(f"n_steps must be at least 1, got {n_steps}")
        first = self.gather(indices)
        idx = np.asarray(indices, dtype=np.int64)
        cur = idx.copy()
        rewards = np.zeros(idx.shape, np.float64)
        discount = np.ones(idx.shape, np.float64)
        terminated = np.zeros(idx.shape, bool)
        alive = np.ones(idx.shape, bool)
        for step in range(int(n_steps)):
            if step:  # go on where the last row neither ended the episode nor was the newest
                nxt = cur + 1
                nxt[nxt == self._capacity] = 0
                alive &= (self._flags[nxt] & VALID) != 0
                cur = np.where(alive, nxt, cur)
            flags = self._flags[cur]
            rewards += np.where(alive, discount * self._rewards[cur], 0.0)
            discount = np.where(alive, discount * gamma, discount)
            terminated |= alive & ((flags & TERMINATED) != 0)
            alive &= (flags & (TERMINATED | TRUNCATED)) == 0
        if np.array_equal(cur, idx):
            next_observations = first.next_observations
        else:
            next_idx = cur + 1
            next_idx[next_idx == self._capacity] = 0
            next_observations = (
                self._obs[next_idx] if self._k == 1 else self._stacks(self._frames(self._chain(next_idx)))
            )
        return first._replace(
            rewards=rewards.astype(np.float32),
            next_observations=next_observations,
            terminated=terminated.astype(np.float32),
            discounts=(discount * ~terminated).astype(np.float32),
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
        idx = self.sample_indices(n)
        if self._k == 1:
            return self._obs[idx]
        return self._stacks(self._frames(self._chain(idx)))

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays.

        Suitable for ``np.savez`` and ``np.load(..., allow_pickle=False)``: the
        generator state is a JSON string in a 0-d unicode array, not a pickle.
        ``obs`` holds one frame per row when ``frame_stack > 1``.
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
            "frame_stack": np.array(self._k, dtype=np.int64),
            "rng_state": np.array(json.dumps(self._rng.bit_generator.state)),
        }

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore from :meth:`state_dict` into this (same-shaped) buffer.

        Arrays are copied into the existing preallocated ones so memory stays
        committed and no reference to the loaded file is kept.  A state without
        ``frame_stack`` (saved before frame stacking existed) counts as 1.

        :raises ValueError: if the state does not match this buffer.
        """
        missing = [k for k in (*_STATE_ARRAYS, *_STATE_SCALARS, "rng_state") if k not in state]
        if missing:
            raise ValueError(f"replay state is missing {', '.join(missing)}")
        saved_k = int(state["frame_stack"]) if "frame_stack" in state else 1
        if saved_k != self._k:
            raise ValueError(
                f"replay state was saved with frame_stack={saved_k} but this buffer has "
                f"frame_stack={self._k}; build the buffer with frame_stack={saved_k}"
            )
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
