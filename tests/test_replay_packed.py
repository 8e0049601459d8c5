"""Tests for the compressed frame rows (replay.compress): the same rows, flags and samples as the
uncompressed buffer, bit-identical stacks, checkpoints, and the byte budget kept by eviction.

The reference is the uncompressed ReplayBuffer fed the same stream: it is tested on its own in
test_replay.py and test_replay_frames.py, so agreeing with it row for row is the specification.
"""

from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import ReplayConfig, TrainConfig
from compress_dqn.replay import packed
from compress_dqn.replay.buffer import ReplayBuffer, build_replay, load_replay, uncompressed_state
from compress_dqn.replay.sizing import ATARI_ROW_BYTES, replay_bytes, replay_capacity, replay_expectation
from test_replay_frames import K, N_ACTIONS, feed, make_stream

BIG = (12, 8)


def widen(x: np.ndarray) -> np.ndarray:
    """A (3, 2, ...) frame (stack) inside a larger, compressible one: mostly zeros, a band that
    changes with the frame id, so keys and deltas both compress and differ."""
    out = np.zeros((*BIG, *x.shape[2:]), np.uint8)
    out[:3, :2] = x
    out[5:8, :] = x[0:1, 0:1]
    return out


def wide_stream(seed: int, n: int) -> list:
    return [(widen(o), a, r, widen(nx), te, tr, re) for o, a, r, nx, te, tr, re in make_stream(np.random.default_rng(seed), n)]


def noisy_stream(seed: int, n: int) -> list:
    """Incompressible frames: zstd cannot shrink them, so rows are stored raw."""
    rng = np.random.default_rng(seed)
    base = [(o, a, r, nx, te, tr, re) for o, a, r, nx, te, tr, re in make_stream(rng, n)]
    noise = {}

    def noisy(x):
        out = np.empty((6, 6, x.shape[-1]), np.uint8)
        for m in range(x.shape[-1]):
            key = x[..., m].tobytes()
            noise.setdefault(key, rng.integers(0, 256, (6, 6), dtype=np.uint8))
            out[..., m] = noise[key]
        return out
    return [(noisy(o), a, r, noisy(nx), te, tr, re) for o, a, r, nx, te, tr, re in base]


def pair(capacity: int, shape: tuple[int, ...], seed: int = 3, **kw) -> tuple[ReplayBuffer, ReplayBuffer]:
    plain = ReplayBuffer(capacity, shape, np.uint8, N_ACTIONS, seed=seed, frame_stack=K)
    packed_ = ReplayBuffer(capacity, shape, np.uint8, N_ACTIONS, seed=seed, frame_stack=K, compress="zstd", **kw)
    return plain, packed_


def assert_same(plain: ReplayBuffer, other: ReplayBuffer) -> None:
    """Same flags, counters and, for every VALID row, the same batch, bit for bit."""
    assert np.array_equal(plain.state_dict()["flags"], other.state_dict()["flags"])
    assert plain.num_transitions == other.num_transitions and plain.size == other.size
    valid = np.flatnonzero(plain.state_dict()["flags"] & 1)
    for a, b in zip(plain.gather(valid), other.gather(valid)):
        if a is not None:
            assert a.dtype == b.dtype and np.array_equal(a, b)
    a, b = plain.gather_n_step(valid, 3, 0.9), other.gather_n_step(valid, 3, 0.9)
    assert np.array_equal(a.next_observations, b.next_observations) and np.array_equal(a.discounts, b.discounts)


@pytest.mark.parametrize("stream", [wide_stream, noisy_stream])
def test_compressed_rows_match_the_uncompressed_buffer_through_many_wraps(stream):
    plain, packed_ = pair(37, (*(BIG if stream is wide_stream else (6, 6)), K))  # 37: the last group is short
    data = stream(0, 400)
    for lo in range(0, len(data), 23):
        feed(plain, data[lo:lo + 23])
        feed(packed_, data[lo:lo + 23])
        assert_same(plain, packed_)
    assert np.array_equal(plain.sample_indices(64), packed_.sample_indices(64))  # same draws, same generator
    kinds = packed_.state_dict()["frame_kind"]
    if stream is wide_stream:
        assert (kinds & packed.DELTA).any() and (kinds & packed.STALE).any() and not (kinds & packed.RAW).any()
        assert packed_.state_dict()["frame_payload"].size < 37 * 12 * 8 / 2  # small frames: the allowance dominates nbytes
    else:
        assert (kinds & packed.RAW).all()


def test_whole_observations_compress_too():
    """frame_stack=1: a row is a whole observation (here float32)."""
    plain = ReplayBuffer(21, (4, 5), np.float32, 3, seed=1)
    other = ReplayBuffer(21, (4, 5), np.float32, 3, seed=1, compress="zstd")
    rng = np.random.default_rng(0)
    obs = np.zeros((4, 5), np.float32)
    for t in range(100):
        nxt = obs.copy()
        nxt[t % 4, t % 5] = rng.normal()
        for buf in (plain, other):
            buf.add(obs, t % 3, 0.5, nxt, t % 9 == 8, False)
        obs = np.zeros((4, 5), np.float32) if t % 9 == 8 else nxt
    valid = plain.sample_indices(50)
    assert np.array_equal(plain.gather(valid).observations, other.gather(valid).observations)
    assert np.array_equal(plain.gather(valid).next_observations, other.gather(valid).next_observations)


def roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    np.savez(buf, **state)
    buf.seek(0)
    with np.load(buf, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def test_checkpoint_mid_group_resumes_exactly(tmp_path):
    """Saved with the write position inside a group and old keys still in use, then loaded into
    a fresh buffer (the delta-encoding key must be decoded again), both go on identically."""
    data = wide_stream(1, 300)
    plain, first = pair(45, (*BIG, K))
    feed(plain, data[:133])
    feed(first, data[:133])
    state = roundtrip(first.state_dict())
    assert state["frame_old_groups"].size and int(state["position"]) % packed.GROUP
    np.savez(tmp_path / "replay.npz", **state)
    resumed = load_replay(tmp_path / "replay.npz", (*BIG, K), np.uint8, N_ACTIONS, frame_stack=K)
    assert resumed.packed is not None and resumed.packed.bound == first.packed.bound
    for buf in (plain, first, resumed):
        feed(buf, data[133:])
    assert_same(plain, resumed)
    assert np.array_equal(first.sample_indices(40), resumed.sample_indices(40))
    assert resumed.nbytes == first.nbytes


def test_a_tight_budget_evicts_the_oldest_rows_and_is_never_exceeded():
    plain, tight = pair(200, (*BIG, K), memory=10_000)
    data = wide_stream(2, 700)
    for i in range(0, len(data), 10):
        feed(plain, data[i:i + 10])
        feed(tight, data[i:i + 10])
        assert tight.nbytes <= tight.packed.bound
        valid = np.flatnonzero(tight.state_dict()["flags"] & 1)
        assert np.all(plain.state_dict()["flags"][valid] & 1)  # eviction only withdraws transitions
        a, b = plain.gather(valid), tight.gather(valid)
        assert np.array_equal(a.observations, b.observations) and np.array_equal(a.next_observations, b.next_observations)
    assert tight.packed.evicted > 0 and 0 < tight.num_transitions < plain.num_transitions


def test_refusals_are_one_line_user_errors():
    with pytest.raises(UserError, match="compressed buffer lives in RAM"):
        ReplayBuffer(50, (*BIG, K), np.uint8, 3, seed=0, frame_stack=K, compress="zstd", memmap_path="/tmp/x")
    with pytest.raises(UserError, match="raise replay.memory"):
        ReplayBuffer(50, (*BIG, K), np.uint8, 3, seed=0, frame_stack=K, compress="zstd", memory=2000)
    with pytest.raises(UserError, match="not a codec"):
        ReplayBuffer(50, (*BIG, K), np.uint8, 3, seed=0, frame_stack=K, compress="lz4")
    with pytest.raises(UserError, match="set replay.memory"):
        ReplayBuffer(50, (*BIG, K), np.uint8, 3, seed=0, frame_stack=K, compress="zstd", memory=2**62)
    plain, other = pair(30, (*BIG, K))
    with pytest.raises(ValueError, match="saved compressed but this buffer is uncompressed"):
        plain.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="saved uncompressed but this buffer is compressed"):
        other.load_state_dict(plain.state_dict())


def test_a_damaged_state_is_refused_before_anything_changes():
    _, other = pair(30, (*BIG, K))
    feed(other, wide_stream(3, 40))
    state = other.state_dict()
    before = other.state_dict()
    for key, bad in [("frame_sizes", state["frame_sizes"] + 1), ("frame_codec", np.array("lz4")),
                     ("frame_old_groups", np.zeros(0, np.int64))]:
        with pytest.raises(ValueError):
            other.load_state_dict({**state, key: bad})
    assert all(np.array_equal(before[k], v) for k, v in other.state_dict().items())


def test_recipe_settings_build_a_compressed_buffer_within_its_budget():
    info = SimpleNamespace(obs_shape=(*BIG, K), obs_dtype=np.uint8, n_actions=3, frame_stack=K)
    train = TrainConfig(buffer_size=1000)
    replay = ReplayConfig(compress="zstd", memory="1MiB")
    assert replay_capacity(train, replay, info) == 1000  # the budget bounds bytes, not rows
    assert replay_bytes(train, replay, info) == 2**20
    buf = build_replay(train, replay, info, seed=0)
    assert buf.packed is not None and buf.packed.bound == 2**20 and buf.capacity == 1000
    raw = replay_bytes(train, ReplayConfig(), info)
    assert raw == 1000 * (12 * 8 + 6)
    # by default, a bound no frame can push it past: every frame raw, every previous key kept
    assert replay_bytes(train, ReplayConfig(compress="zstd"), info) == build_replay(
        train, ReplayConfig(compress="zstd"), info, seed=0).packed.bound > raw
    assert build_replay(train, ReplayConfig(), info, seed=0).packed is None
    with pytest.raises(ValueError):
        ReplayConfig(compress="gzip")


def test_an_uncompressed_copy_loads_into_a_plain_buffer():
    plain, other = pair(40, (*BIG, K))
    data = wide_stream(4, 120)
    feed(plain, data)
    feed(other, data)
    copy = ReplayBuffer(40, (*BIG, K), np.uint8, N_ACTIONS, seed=9, frame_stack=K)
    copy.load_state_dict(uncompressed_state(other))
    assert all(np.array_equal(v, copy.state_dict()[k]) for k, v in plain.state_dict().items() if k != "rng_state")


def test_validate_says_what_a_compressed_buffer_is_expected_to_hold():
    info = SimpleNamespace(obs_shape=(84, 84, 4), obs_dtype=np.uint8, n_actions=6, frame_stack=4)
    train = TrainConfig(buffer_size=1_000_000)
    assert replay_expectation(train, ReplayConfig(), info) is None
    assert "all fit, whatever the frames" in replay_expectation(train, ReplayConfig(compress="zstd"), info)
    roomy = replay_expectation(train, ReplayConfig(compress="zstd", memory="1GiB"), info)
    assert "averages 1074 B or less" in roomy and "all of them expected to fit" in roomy
    tight = replay_expectation(train, ReplayConfig(compress="zstd", memory="100MiB"), info)
    lo, hi = ATARI_ROW_BYTES
    per_row = (100 * 2**20 - 2 * (84 * 84 + 64)) / 1_000_000
    assert f"{int(1_000_000 * per_row / hi)}-{int(1_000_000 * per_row / lo)} of them expected to fit" in tight
