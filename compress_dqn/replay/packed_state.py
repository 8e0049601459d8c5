"""Compressed frame rows as plain numpy arrays for checkpoints and replay.npz, and back, checked.

Payloads are saved as they are stored (no recompression): one concatenated uint8 array with each
row's size and kind, the previous keys still in use beside them, the layout's name (a different
codec, level or group size is refused, not misread) and the buffer's byte budget.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from compress_dqn.replay.packed import GROUP, LAYOUT, STALE, PackedFrames

__all__ = ["STATE_KEYS", "check_state", "is_packed", "load_state", "state_of"]

STATE_KEYS = ("frame_codec", "frame_kind", "frame_sizes", "frame_payload", "frame_old_groups", "frame_old_kinds",
              "frame_old_sizes", "frame_old_payload", "frame_budget")


def is_packed(state: Mapping[str, np.ndarray]) -> bool:
    """Whether a replay state_dict holds compressed frame rows (else an ``obs`` array)."""
    return "frame_payload" in state


def state_of(frames: PackedFrames) -> dict[str, np.ndarray]:
    """The rows as plain arrays (the payload a copy)."""
    sizes = np.fromiter((len(b) if b is not None else 0 for b in frames.rows), np.uint32, frames.capacity)
    groups = np.array(sorted(frames.old_keys), dtype=np.int64)
    old = [frames.old_keys[g] for g in groups.tolist()]
    return {
        "frame_codec": np.array(LAYOUT),
        "frame_kind": frames.kind.copy(),
        "frame_sizes": sizes,
        "frame_payload": np.frombuffer(b"".join(b for b in frames.rows if b is not None), np.uint8),
        "frame_old_groups": groups,
        "frame_old_kinds": np.array([k for _, k in old], dtype=np.uint8),
        "frame_old_sizes": np.array([len(b) for b, _ in old], dtype=np.uint32),
        "frame_old_payload": np.frombuffer(b"".join(b for b, _ in old), np.uint8),
        "frame_budget": np.array(frames.bound, dtype=np.int64),
    }


def check_state(frames: PackedFrames, state: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError unless ``state`` is this layout's, for this many rows, and self-consistent."""
    codec = str(np.asarray(state["frame_codec"])[()])
    if codec != LAYOUT:
        raise ValueError(f"replay state's frames are packed as {codec!r}; this version reads {LAYOUT!r}")
    kind, sizes = np.asarray(state["frame_kind"]), np.asarray(state["frame_sizes"])
    if kind.shape != (frames.capacity,) or sizes.shape != (frames.capacity,):
        raise ValueError(f"replay state holds {kind.shape[0]} compressed rows, this buffer has {frames.capacity}")
    if int(sizes.sum(dtype=np.int64)) != np.asarray(state["frame_payload"]).size:
        raise ValueError("replay state's frame sizes do not add up to its payload")
    if not np.array_equal(kind != 0, sizes != 0):
        raise ValueError("replay state's frame kinds and sizes disagree on which rows hold a frame")
    if int(np.asarray(state["frame_old_sizes"]).sum(dtype=np.int64)) != np.asarray(state["frame_old_payload"]).size:
        raise ValueError("replay state's previous-key sizes do not add up to their payload")
    stale = np.flatnonzero(kind & STALE)
    if not set((stale - stale % GROUP).tolist()) <= set(np.asarray(state["frame_old_groups"]).tolist()):
        raise ValueError("replay state has rows that decode against a previous key it does not hold")


def _split(payload: np.ndarray, sizes: np.ndarray) -> list[bytes]:
    """The payload cut into exact-size bytes objects, one per size."""
    data = np.asarray(payload).tobytes()
    ends = np.cumsum(np.asarray(sizes).astype(np.int64)).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def load_state(frames: PackedFrames, state: Mapping[str, np.ndarray]) -> None:
    """Restore the rows of ``state`` into ``frames`` after checking it (the budget stays frames' own)."""
    check_state(frames, state)
    rows: list[bytes | None] = [b if b else None for b in _split(state["frame_payload"], state["frame_sizes"])]
    old = _split(state["frame_old_payload"], state["frame_old_sizes"])
    groups, kinds = np.asarray(state["frame_old_groups"]).tolist(), np.asarray(state["frame_old_kinds"]).tolist()
    frames.adopt(rows, np.asarray(state["frame_kind"]).astype(np.uint8).copy(),
                 {int(g): (blob, int(k)) for g, k, blob in zip(groups, kinds, old)})
