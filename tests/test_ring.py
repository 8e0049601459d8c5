"""Tests for compress_dqn.replay.ring: the write position wraps, state round-trips through an .npz without
pickle, mismatched states are refused before anything changes, and memmap fields live on disk."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.replay import budget as replay_budget
from compress_dqn.errors import UserError
from compress_dqn.replay.ring import Ring

FIELDS = {"x": ((2, 3), np.uint8), "y": ((), np.float32)}


def filled(capacity: int, writes: int) -> Ring:
    ring = Ring(capacity, FIELDS)
    for t in range(writes):
        ring["x"][ring.pos] = t
        ring["y"][ring.pos] = t / 2
        ring.advance()
    return ring


def test_advance_wraps_and_counts_rows():
    ring = filled(4, 6)
    assert (ring.pos, ring.size) == (2, 4)
    assert ring["x"][:, 0, 0].tolist() == [4, 5, 2, 3]
    assert ring.nbytes == 4 * (6 + 4)
    assert ring.state_keys == ("x", "y", "position", "size")


def test_state_round_trip_without_pickle(tmp_path):
    ring = filled(5, 7)
    path = tmp_path / "ring.npz"
    np.savez(path, **ring.state_dict())
    other = Ring(5, FIELDS)
    with np.load(path, allow_pickle=False) as data:
        other.load_state_dict(dict(data))
    assert (other.pos, other.size) == (ring.pos, ring.size)
    for key in FIELDS:
        np.testing.assert_array_equal(other[key], ring[key])
    assert other["x"] is not ring["x"]  # copied into its own preallocated arrays


def test_mismatched_state_refused_untouched():
    ring = filled(5, 3)
    bad = dict(Ring(6, FIELDS).state_dict())
    with pytest.raises(ValueError, match="'x' is uint8"):
        ring.load_state_dict(bad)
    state = dict(filled(5, 2).state_dict(), position=np.array(5))
    with pytest.raises(ValueError, match="position 5"):
        ring.load_state_dict(state)
    assert (ring.pos, ring.size) == (3, 3)
    assert ring["x"][:, 0, 0].tolist() == [0, 1, 2, 0, 0]


def test_memmap_field_on_disk_only_ram_fields_checked(tmp_path, monkeypatch):
    big = {"frames": ((1000,), np.uint8), "flags": ((), np.uint8)}
    monkeypatch.setattr(replay_budget.psutil, "virtual_memory", lambda: SimpleNamespace(available=100_000))
    with pytest.raises(UserError, match="100 transitions"):
        Ring(100, big)  # 100 kB of frames in RAM > 90% of 100 kB
    ring = Ring(100, big, memmap={"frames": tmp_path / "frames.bin"})
    assert isinstance(ring["frames"], np.memmap)
    assert (tmp_path / "frames.bin").stat().st_size == 100_000
    assert ring.nbytes == 100_100
