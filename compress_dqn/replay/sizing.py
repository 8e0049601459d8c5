"""How big a replay buffer is, before one is allocated: its row layout, the rows a byte budget holds, and what a
recipe's buffer needs (rows, bytes, what a compressed one is expected to hold). budget.py checks the figures
against the machine; buffer.py allocates the layout.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from compress_dqn.envs.environment import EnvInfo
from compress_dqn.recipe.schema import ReplayConfig, TrainConfig
from compress_dqn.replay.budget import format_bytes, rows_for_budget
from compress_dqn.replay.frames import frame_shape
from compress_dqn.replay.packed import row_allowance, worst_case

# Bytes a row took, compressed, in benchmarks/replay_memory.py's five Atari games (lowest, highest):
# what validate quotes beside a compressed buffer's budget.
ATARI_ROW_BYTES = (185, 566)


def action_dtype(n_actions: int) -> np.dtype:
    """Smallest unsigned dtype that holds actions 0 .. n_actions - 1."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if n_actions - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    raise ValueError(f"n_actions={n_actions} is too large (at most 2**32)")


def positive_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def normalize_shape(obs_shape: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in obs_shape)
    except TypeError:
        raise ValueError(f"obs_shape must be a tuple of ints, got {obs_shape!r}") from None
    if any(d < 1 for d in shape):
        raise ValueError(f"obs_shape dimensions must be >= 1, got {shape}")
    return shape


class FieldSpec(NamedTuple):
    """One array of the ring: the shape of one row, and its dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def row_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class RowLayout(NamedTuple):
    """The ring's arrays, in state_dict order: obs (or one frame), action, reward, flags."""

    obs: FieldSpec
    actions: FieldSpec
    rewards: FieldSpec
    flags: FieldSpec

    def fields(self, frames: bool = True) -> dict[str, FieldSpec]:
        """The arrays by name, as Ring takes them; without obs where compressed frames hold them apart."""
        return {name: spec for name, spec in zip(self._fields, self) if frames or name != "obs"}

    def row_bytes(self, frames: bool = True) -> int:
        """Bytes one row costs in the ring (without obs: the fixed part beside compressed frames)."""
        return sum(spec.row_bytes for spec in self.fields(frames).values())


def row_layout(frame: tuple[int, ...], obs_dtype: np.dtype, action_dtype: np.dtype) -> RowLayout:
    """The ring's arrays. One place, so the ring and bytes_per_row cannot disagree."""
    return RowLayout(
        obs=FieldSpec(frame, obs_dtype),
        actions=FieldSpec((), action_dtype),
        rewards=FieldSpec((), np.dtype(np.float32)),
        flags=FieldSpec((), np.dtype(np.uint8)),
    )


def checked_layout(
    capacity: int, obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int, k: int
) -> RowLayout:
    """The ring's fields for a buffer's checked arguments, refusing a capacity too small for one
    transition's stacks before anything is allocated."""
    frame = frame_shape(obs_shape, k)
    if capacity < k + 1:
        raise ValueError(
            f"capacity={capacity} is too small for frame_stack={k}: one "
            f"transition needs up to {k + 1} rows; use capacity >= {k + 1}"
        )
    return row_layout(frame, np.dtype(obs_dtype), action_dtype(n_actions))


def bytes_per_row(obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int, *, frame_stack: int = 1) -> int:
    """Exact bytes one row costs (obs or one frame + action + reward + flags)."""
    k = positive_int("frame_stack", frame_stack, 1)
    frame = frame_shape(normalize_shape(obs_shape), k)
    return row_layout(frame, np.dtype(obs_dtype), action_dtype(positive_int("n_actions", n_actions, 1))).row_bytes()


def packed_bound(capacity: int, fields: RowLayout) -> int:
    """The default bound of a compressed buffer: the most its rows can hold (no frame compressing),
    so by default nothing is evicted and it samples exactly as the uncompressed buffer."""
    return capacity * fields.row_bytes(frames=False) + worst_case(capacity, fields.obs.row_bytes)


def capacity_for_budget(budget_bytes: int, obs_shape: tuple[int, ...], obs_dtype: npt.DTypeLike, n_actions: int, *,
                        frame_stack: int = 1) -> int:
    """Rows of a ReplayBuffer that fit in ``budget_bytes``; UserError if fewer than one transition
    needs (2, or ``frame_stack + 1``)."""
    row_bytes = bytes_per_row(obs_shape, obs_dtype, n_actions, frame_stack=frame_stack)
    return rows_for_budget(budget_bytes, row_bytes, max(2, int(frame_stack) + 1))


def replay_capacity(train: TrainConfig, replay: ReplayConfig, info: EnvInfo) -> int:
    """Rows of the replay buffer: train.buffer_size, bounded by replay.memory (compressed, the
    budget bounds bytes instead, by evicting the oldest rows: see packed.py)."""
    if replay.memory is None or replay.compress is not None:
        return train.buffer_size
    return min(
        train.buffer_size,
        capacity_for_budget(
            replay.memory, info.obs_shape, info.obs_dtype, info.n_actions, frame_stack=info.frame_stack
        ),
    )


def replay_bytes(train: TrainConfig, replay: ReplayConfig, info: EnvInfo) -> int:
    """The most bytes the recipe's replay buffer may hold: its arrays, or compressed, its budget
    (replay.memory, else the bound that never evicts: see packed_bound)."""
    capacity = replay_capacity(train, replay, info)
    if replay.compress is not None and replay.memory is not None:
        return int(replay.memory)
    fields = checked_layout(capacity, normalize_shape(info.obs_shape), info.obs_dtype, info.n_actions, info.frame_stack)
    if replay.compress is None:
        return capacity * fields.row_bytes()
    return packed_bound(capacity, fields)


def replay_expectation(train: TrainConfig, replay: ReplayConfig, info: EnvInfo) -> str | None:
    """What a compressed buffer is expected to hold, for validate (None when uncompressed): the
    bytes a row may average for all rows to fit its budget, and how many rows fit at the sizes
    Atari frames measured (docs/replay-memory.md); past the budget the oldest rows are evicted."""
    if replay.compress is None:
        return None
    capacity = replay_capacity(train, replay, info)
    fields = checked_layout(capacity, normalize_shape(info.obs_shape), info.obs_dtype, info.n_actions, info.frame_stack)
    bound = replay_bytes(train, replay, info)
    per_row = row_allowance(capacity, fields.obs.row_bytes, bound)
    if bound >= packed_bound(capacity, fields):
        return f"replay: {replay.compress}-compressed, {capacity} rows within {format_bytes(bound, 1)}: all fit, whatever the frames"
    held = [min(capacity, int(capacity * per_row / b)) for b in ATARI_ROW_BYTES]
    expect = "all of them" if held[1] == capacity else f"{held[1]}-{held[0]} of them"
    return (f"replay: {replay.compress}-compressed, {capacity} rows within {format_bytes(bound, 1)}: all fit while a row "
            f"averages {max(0.0, per_row):.0f} B or less (past that the oldest are evicted); 84x84 Atari frames cost "
            f"{ATARI_ROW_BYTES[0]}-{ATARI_ROW_BYTES[1]} B a row (docs/replay-memory.md): {expect} expected to fit")
