"""The replay buffer DQN samples from: a ring that stores every observation once, with a byte budget.

The design follows Stable-Baselines3's ``buffers.py`` (preallocated numpy arrays, a ``NamedTuple``
of samples, a psutil memory check) and Dopamine's circular buffer (storage apart from the
transition logic), with one change that matters for image observations: each observation is
stored once.  A transition's next observation is simply the next row of the ring, so a stream of
transitions costs one row each plus one extra row per episode end, instead of two full
observations per transition.

Row layout (``capacity`` rows in a :class:`~compress_dqn.replay.ring.Ring`)::

    obs[i]      observation, native dtype (float32, uint8, ...); with
                frame_stack=k > 1, only the newest frame of the stack
    actions[i]  action taken in obs[i] (smallest unsigned dtype that fits)
    rewards[i]  reward of that action (float32)
    flags[i]    VALID | TERMINATED | TRUNCATED | START bitfield (uint8)

:mod:`compress_dqn.replay.index` decides from ``flags`` which rows are sampleable transitions (an
episode's final observation gets a row of its own that is never VALID) and draws them;
:mod:`compress_dqn.replay.frames` rebuilds frame stacks from single-frame rows;
:mod:`compress_dqn.replay.sizing` lays the rows out and sizes a recipe's buffer;
:mod:`compress_dqn.replay.budget` refuses a buffer that would not fit in memory or on disk.
"""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import numpy as np
import numpy.typing as npt

from compress_dqn.envs.environment import EnvInfo
from compress_dqn.recipe.schema import ReplayConfig, TrainConfig
from compress_dqn.errors import UserError
from compress_dqn.replay.budget import check_bound, format_bytes
from compress_dqn.replay.frames import Rows, pairs_at, stacks_at
from compress_dqn.replay.index import START, TERMINATED, TRUNCATED, VALID, TransitionIndex, next_rows
from compress_dqn.replay import packed_state
from compress_dqn.replay.packed import CODEC, PackedFrames
from compress_dqn.replay import sizing
from compress_dqn.replay.sizing import RowLayout, checked_layout, normalize_shape, packed_bound, positive_int, replay_capacity
from compress_dqn.replay.ring import Ring
from compress_dqn.replay.writer import TransitionWriter

__all__ = ["Batch", "ReplayBuffer", "VALID", "TERMINATED", "TRUNCATED", "START", "format_bytes"]


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


class ReplayBuffer:
    """Ring buffer of transitions that stores every observation once.

    :param capacity: number of rows (roughly transitions; each episode end costs one extra row for
        its final observation). At least 2, and at least ``frame_stack + 1`` (one transition's
        stacks need that many rows).
    :param obs_shape: shape of one observation (with ``frame_stack=k > 1``, a channels-last stack
        ``(..., k)``, newest frame last).
    :param obs_dtype: dtype observations are stored in (keep uint8 images as uint8: that is what
        makes large buffers fit).
    :param n_actions: number of discrete actions (picks the action dtype).
    :param seed: seed of the sampling generator.
    :param frame_stack: frames per observation stack; rows then hold single frames and stacks are
        rebuilt at sample time (see :mod:`compress_dqn.replay.frames`).
    :param memmap_path: if set, the observation/frame array is an ``np.memmap`` scratch file there
        (created or overwritten, left in place afterwards), trading RAM for disk and page cache:
        the OS keeps hot pages cached and evicts the rest.  Its disk space is reserved up front.
        Not a checkpoint: use :meth:`state_dict` for that.  Not with ``compress``.
    :param compress: ``"zstd"``: frames kept compressed (:mod:`compress_dqn.replay.packed`), same
        rows and samples, bit-identical stacks.  ``memory`` is then its byte budget (default: one
        that never evicts); past it the oldest rows are evicted.
    :raises UserError: if the buffer does not fit in available memory (or the memmap file on its disk).
    """

    def __init__(
        self, capacity: int, obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int,
        seed: int | np.random.SeedSequence, *, frame_stack: int = 1, memmap_path: str | os.PathLike[str] | None = None,
        compress: str | None = None, memory: int | None = None,
    ) -> None:
        self._capacity = positive_int("capacity", capacity, 2)
        self._n_actions = positive_int("n_actions", n_actions, 1)
        self._k = positive_int("frame_stack", frame_stack, 1)
        self._obs_shape = normalize_shape(obs_shape)
        fields = checked_layout(self._capacity, self._obs_shape, obs_dtype, self._n_actions, self._k)
        self._obs_dtype: np.dtype = fields.obs.dtype
        self._ring, self._packed = _storage(self._capacity, fields, self._k, memmap_path, compress, memory)
        self._obs: Rows = self._ring["obs"] if self._packed is None else self._packed
        # The ring's arrays under short names: sampling reads them on every call.
        self._actions, self._rewards, self._flags = (self._ring[name] for name in ("actions", "rewards", "flags"))
        self._index = TransitionIndex(self._flags, self._k, seed)
        self._rng = self._index.rng  # the sampling generator
        self._writer = TransitionWriter(self._ring, self._index, self._obs_shape, self._n_actions, self._packed)

    @staticmethod
    def bytes_per_row(
        obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int, *, frame_stack: int = 1
    ) -> int:
        """Exact bytes one row costs (obs or one frame + action + reward + flags)."""
        return sizing.bytes_per_row(obs_shape, obs_dtype, n_actions, frame_stack=frame_stack)

    @property
    def nbytes(self) -> int:
        """Bytes held by the arrays (a memmap file's included) and the compressed rows (packed.py)."""
        return self._ring.nbytes + (self._packed.nbytes if self._packed is not None else 0)

    @property
    def packed(self) -> PackedFrames | None:
        """The compressed frame rows (their byte budget ``bound``, rows ``evicted``), or None."""
        return self._packed

    @property
    def capacity(self) -> int:
        """Number of rows in the ring."""
        return self._capacity

    @property
    def size(self) -> int:
        """Rows written so far (at most ``capacity``)."""
        return self._ring.size

    @property
    def num_transitions(self) -> int:
        """Transitions that can be sampled right now (VALID rows)."""
        return self._index.num_valid

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

    # ------------------------------------------------------- adding, sampling

    def add(
        self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> None:
        """Store one transition.  When ``obs`` is the previous add's ``next_obs`` (same object,
        or equal values) and that add did not end the episode, its row is reused, so consecutive
        transitions share observations (see :mod:`compress_dqn.replay.writer`).

        With ``frame_stack=k > 1``, ``next_obs`` must be ``obs`` shifted by one frame
        (``next_obs[..., :-1] == obs[..., 1:]``), as a frame-stack wrapper gives.  Observations
        are copied, but the identity fast path assumes the caller does not modify a passed
        ``next_obs`` in place before the next add.

        :raises ValueError: on a wrong shape, an out-of-range action or a next_obs that is not
            obs shifted by one frame; nothing is written then.
        """
        self._writer.add(obs, action, reward, next_obs, terminated, truncated)

    def sample_indices(self, n: int) -> np.ndarray:
        """``n`` VALID row indices, uniform with replacement; ValueError if there are none."""
        n = int(n)
        if n < 0:
            raise ValueError(f"cannot sample {n} transitions")
        if self._index.num_valid == 0:
            raise ValueError("replay buffer has no complete transitions to sample")
        return self._index.sample(n, self._ring.size)

    def gather(self, indices: npt.ArrayLike) -> Batch:
        """Build a batch from VALID row indices (vectorised, no per-row loop); ValueError on any
        other index."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {idx.shape}")
        flags = self._flags[idx]
        if not np.all(flags & VALID):
            raise ValueError("gather got indices that are not valid transitions")
        next_idx = next_rows(idx, self._capacity)
        observations, next_observations = pairs_at(self._obs, self._flags, idx, next_idx, self._k)
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
        cur, rewards, discount, terminated = self._index.n_step(idx, self._rewards, int(n_steps), gamma)
        if np.array_equal(cur, idx):
            next_observations = first.next_observations
        else:
            next_observations = stacks_at(self._obs, self._flags, next_rows(cur, self._capacity), self._k)
        return first._replace(
            rewards=rewards.astype(np.float32),
            next_observations=next_observations,
            terminated=terminated.astype(np.float32),
            discounts=(discount * ~terminated).astype(np.float32),
        )

    def sample(self, batch_size: int) -> Batch:
        """Uniform batch of transitions. For several minibatches, sample ``batch_size * k`` and
        reshape: one gather is much cheaper than k."""
        return self.gather(self.sample_indices(batch_size))

    def sample_observations(self, n: int) -> np.ndarray:
        """n observations from uniformly sampled transitions, without gathering the rest of the
        batch (calibration and distillation need states only). Draws exactly as sample(n) does."""
        return self.observations_at(self.sample_indices(n))

    def observations_at(self, indices: npt.ArrayLike) -> np.ndarray:
        """The observations of rows `indices` (copies; rebuilt stacks where frames are stacked)."""
        return stacks_at(self._obs, self._flags, np.asarray(indices, dtype=np.int64), self._k)

    # ------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to resume exactly, as plain numpy arrays for ``np.savez`` and
        ``np.load(..., allow_pickle=False)``. ``obs`` holds one frame per row when frame_stack > 1;
        compressed, the ``frame_*`` arrays hold the packed rows instead (their payload a copy)."""
        packed = packed_state.state_of(self._packed) if self._packed is not None else {}
        return {**self._ring.state_dict(), **self._index.state_dict(), **packed}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore from :meth:`state_dict` into this (same-shaped) buffer; everything is checked
        before anything changes, so a ValueError leaves the buffer as it was."""
        _check_and_load(self._ring, self._index, self._packed, state)
        # The object is gone; the writer falls back to comparing values.
        self._writer.last_next_obs = None


def uncompressed_state(replay: ReplayBuffer) -> dict[str, np.ndarray]:
    """``replay.state_dict()`` with its frames decoded into an ``obs`` array, as an uncompressed
    buffer of the same shape saves and loads it."""
    if replay.packed is None:
        return replay.state_dict()
    return {"obs": replay.packed.decoded(), **replay._ring.state_dict(), **replay._index.state_dict()}


def _check_and_load(ring: Ring, index: TransitionIndex, packed: PackedFrames | None, state: dict[str, np.ndarray]) -> None:
    """ReplayBuffer.load_state_dict: check every part of ``state``, then load them."""
    saved = packed_state.is_packed(state)
    if saved != (packed is not None):
        raise ValueError(f"replay state was saved {'compressed' if saved else 'uncompressed'} but this buffer is "
                         f"{'uncompressed' if saved else 'compressed'}; build it with compress={CODEC if saved else None!r}")
    packed_keys = packed_state.STATE_KEYS if packed is not None else ()
    missing = [k for k in (*ring.state_keys, *index.state_keys, *packed_keys) if k not in state]
    if missing:
        raise ValueError(f"replay state is missing {', '.join(missing)}")
    index.check_frame_stack(state)
    ring.check_state(state)
    index.check_state(state)
    if packed is not None:
        packed_state.load_state(packed, state)  # checks before it changes anything
    index.load_state_dict(state)
    ring.load_state_dict(state)


@contextlib.contextmanager
def sampling_undone(replay: ReplayBuffer) -> Iterator[None]:
    """Whatever is sampled from `replay` inside leaves its sampling generator where it was: a
    build stage that may instead be loaded from a file (a shared pruning) does not shift what the
    stages after it sample."""
    state = copy.deepcopy(replay._rng.bit_generator.state)
    try:
        yield
    finally:
        replay._rng.bit_generator.state = state


def load_replay(path: Path, obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int, *,
                frame_stack: int = 1) -> ReplayBuffer:
    """A buffer of exactly the rows of a ReplayBuffer.state_dict() saved as .npz (no pickle), restored."""
    with np.load(path, allow_pickle=False) as data:
        state = {key: data[key] for key in data.files}
    packed = {"compress": CODEC, "memory": int(state["frame_budget"])} if packed_state.is_packed(state) else {}
    replay = ReplayBuffer(len(state["flags"]), obs_shape, obs_dtype, n_actions, seed=0, frame_stack=frame_stack, **packed)
    replay.load_state_dict(state)
    return replay


def _storage(capacity: int, fields: RowLayout, k: int, memmap_path: Any, compress: str | None,
             memory: int | None) -> tuple[Ring, PackedFrames | None]:
    """The ring (with the frames, or without them beside the compressed rows); compressed, after
    checking its byte bound (``memory``, or by default one that never evicts) fits in memory."""
    if compress is None:
        return Ring(capacity, fields.fields(), None if memmap_path is None else {"obs": Path(memmap_path)}), None
    if compress != CODEC:
        raise UserError(f"replay.compress: {compress!r} is not a codec this buffer has; use {CODEC!r} or null")
    if memmap_path is not None:
        raise UserError("replay: a compressed buffer lives in RAM; drop memmap_path or replay.compress")
    bound = packed_bound(capacity, fields) if memory is None else int(memory)
    check_bound(bound)
    ring = Ring(capacity, fields.fields(frames=False))
    return ring, PackedFrames(capacity, fields.obs.shape, fields.obs.dtype, bound, ring.nbytes, protect=k + 2)


def build_replay(train: TrainConfig, replay: ReplayConfig, info: EnvInfo, seed: int | np.random.SeedSequence) -> ReplayBuffer:
    """The replay buffer a recipe's train, replay and environment describe."""
    return ReplayBuffer(replay_capacity(train, replay, info), info.obs_shape, info.obs_dtype, info.n_actions,
                        seed, frame_stack=info.frame_stack, compress=replay.compress,
                        memory=replay.memory if replay.compress is not None else None)


