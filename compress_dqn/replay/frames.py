"""Frame stacks stored as one frame per ring row: gathered back into stacks, split into rows.

With ``frame_stack=k > 1`` (Atari style) observations are channels-last stacks ``(..., k)``, newest
frame last, and a row holds one frame, so a transition costs one frame instead of k (or 2k).  The
stack of row ``i`` is rows ``i-k+1 .. i``, except that the walk back stops at a START row (the
first row of a stored history) and repeats its frame.  That is how a frame-stack wrapper pads a
fresh episode with copies of its reset frame, so stacks never cross an episode boundary and a
reset stack costs one row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from compress_dqn.replay.index import START
from compress_dqn.replay.packed import PackedFrames

Rows = np.ndarray | PackedFrames  # frames in RAM (or memmap), or compressed

__all__ = ["Rows", "frame_shape", "gather", "history_frames", "next_frame", "pairs_at", "stack", "stack_rows", "stacks_at"]


def frame_shape(obs_shape: tuple[int, ...], frame_stack: int) -> tuple[int, ...]:
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


def stack_rows(flags: np.ndarray, idx: np.ndarray, k: int) -> list[np.ndarray]:
    """Rows of each stack, newest first: k-1 steps back, standing still at START rows."""
    capacity = flags.shape[0]
    rows = [idx]
    cur = idx
    for _ in range(k - 1):
        back = cur - 1
        back[back < 0] = capacity - 1
        cur = np.where(flags[cur] & START, cur, back)
        rows.append(cur)
    return rows


def stack(frames_newest_first: list[np.ndarray]) -> np.ndarray:
    """Frames gathered newest first (one array of B frames each) as (B, ..., k) stacks."""
    return np.stack(frames_newest_first[::-1], axis=-1)


def gather(obs: Rows, rows: list[np.ndarray], scratch: bool = False) -> list[np.ndarray]:
    """The frames of each array of row indices; compressed rows are decoded in one pass, so a
    key or a row shared by several stacks is decoded once. ``scratch``: the caller copies the
    frames out before the next gather (the compressed store may then reuse its arrays)."""
    if isinstance(obs, np.ndarray):
        return [obs[r] for r in rows]
    return list(obs.take(np.stack(rows), scratch=scratch))


def stacks_at(obs: Rows, flags: np.ndarray, idx: np.ndarray, k: int) -> np.ndarray:
    """Observations of rows ``idx`` (copies): the rows themselves, or their rebuilt stacks."""
    if k == 1:
        return gather(obs, [idx])[0]
    return stack(gather(obs, stack_rows(flags, idx, k), scratch=True))


def pairs_at(
    obs: Rows, flags: np.ndarray, idx: np.ndarray, next_idx: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Observations of transitions starting at rows ``idx`` and of their next rows ``next_idx``.

    The next stack reuses the obs stack's k-1 newest frames plus the next row's frame, so a pair
    reads k + 1 frames, not 2k.
    """
    if k == 1:
        first, second = gather(obs, [idx, next_idx])
        return first, second
    nxt, *frames = gather(obs, [next_idx, *stack_rows(flags, idx, k)], scratch=True)
    return stack(frames), stack([nxt, *frames[:-1]])


Equal = Callable[[np.ndarray, np.ndarray], bool]


def next_frame(obs: np.ndarray, next_obs: np.ndarray, k: int, equal: Equal) -> np.ndarray:
    """The frame (k > 1) that ``next_obs`` adds to ``obs``: the next row stores only that.

    :raises ValueError: if next_obs is not obs shifted by one frame, as a frame-stack wrapper gives.
    """
    # Frame by frame: comparing the strided (..., k-1) views at once was slower (docs/replay-memory.md).
    if not all(equal(next_obs[..., m], obs[..., m + 1]) for m in range(k - 1)):
        raise ValueError(
            f"with frame_stack={k}, next_obs must be obs shifted by one frame "
            "(next_obs[..., :-1] == obs[..., 1:]) but its older frames differ; pass the "
            "frame-stack wrapper's stacks (at an episode end, the final observation, "
            "not the reset one)"
        )
    return next_obs[..., -1]


def history_frames(obs: np.ndarray, k: int, equal: Equal) -> list[np.ndarray]:
    """Rows that store ``obs`` as a fresh history, oldest first; the first one is to be START.

    The rebuild repeats the START row's frame for older positions, so only frames from the end
    of the leading run of copies of the oldest frame need rows: one row for a reset stack of k
    copies, up to k otherwise (a stack that a rebuild would not pad that way is stored exactly).
    """
    if k == 1:
        return [obs]
    frames = np.moveaxis(obs, -1, 0)  # (k, *frame_shape), oldest first
    first = 0
    while first + 1 < k and equal(frames[first + 1], frames[0]):
        first += 1
    return list(frames[first:])
