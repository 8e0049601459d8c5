"""How many replay rows a brought baseline's data fills, known before anything is loaded.

A brought baseline trains nothing: its replay buffer holds only its rollout or its transitions,
written once to baseline/, never to checkpoints. The up-front resources check plans with these
rows, not with train.buffer_size (an RL Zoo Atari agent's 100,000-1,000,000 rows of 84x84x4
frames would ask for tens of GiB that a 200-step rollout never uses), and rollout and
load_transitions size their buffers with the same functions. No TensorFlow here: validate
plans too.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from compress_dqn.recipe.schema import BaselineConfig
from compress_dqn.store.layout import RunLayout


def rollout_rows(capacity: int, steps: int) -> int:
    """Rows for a rollout of `steps` steps: one per step, and room for the extra row each episode's
    first observation takes (an episode every other step), bounded by the recipe's capacity (a ring
    that fills evicts its oldest rows)."""
    return max(2, min(capacity, steps + steps // 2 + 2))


def transition_rows(capacity: int, transitions: int, frame_stack: int) -> int:
    """Rows for unrelated transitions: up to frame_stack + 1 rows each (a stack's history, then the
    next frame: see replay/writer.py), bounded by the recipe's capacity."""
    return max(2, min(capacity, (frame_stack + 1) * transitions))


def brought_replay(source: BaselineConfig, capacity: int, frame_stack: int, row_bytes: int) -> tuple[int, int]:
    """(rows, bytes) of the replay buffer a brought baseline's data (the recipe's baseline block) will fill.
    An unreadable transitions file plans with the capacity; its loader says what is wrong with it. Another
    run's replay is planned at its file's size."""
    other = RunLayout.find(source.from_)
    if source.transitions is None and other is not None:
        size = other.replay.stat().st_size
        return max(2, size // max(1, row_bytes)), size
    if source.transitions is None:
        rows = rollout_rows(capacity, source.rollout.steps)
    else:
        rows = transition_rows(capacity, _transitions_in(Path(source.transitions), capacity), frame_stack)
    return rows, rows * row_bytes


def _transitions_in(path: Path, fallback: int) -> int:
    """Transitions in an .npz (only its actions array is read), or `fallback` if it cannot be read."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return len(data["actions"])
    except (OSError, ValueError, KeyError):
        return fallback
