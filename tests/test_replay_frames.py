"""Tests for frame stacking in compress_dqn.replay.buffer: exact stacks after many ring wraps,
episode boundaries, byte accounting, checkpoints and the memmap backing.

Frames are (3, 2) uint8 carrying a unique frame id and an episode id, so every stack is
unique and a brute-force reference (every transition ever added, with the global rows its
stacks depend on) says exactly which transitions must still be sampleable.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from compress_dqn.replay import buffer as replay
from compress_dqn.replay import budget as replay_budget
from compress_dqn.errors import UserError
from compress_dqn.replay.buffer import ReplayBuffer
from compress_dqn.replay.sizing import capacity_for_budget

K = 4
FRAME = (3, 2)
OBS_SHAPE = (*FRAME, K)
N_ACTIONS = 3


class Frames:
    """Unique frames: [[id lo, id hi], [episode lo, episode hi], [kind, 0]]."""

    def __init__(self) -> None:
        self.next_id = 1

    def new(self, episode: int, kind: int = 0) -> np.ndarray:
        i = self.next_id
        self.next_id += 1
        assert i < 2**16
        return np.array([[i % 256, i // 256], [episode % 256, episode // 256], [kind, 0]], np.uint8)


def stack(frames) -> np.ndarray:
    return np.stack(frames, axis=-1)


def shifted(obs: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """What a frame-stack wrapper returns after one step: drop the oldest, append the newest."""
    return np.concatenate([obs[..., 1:], frame[..., None]], axis=-1)


def episode_of(frame: np.ndarray) -> int:
    return int(frame[1, 0]) + 256 * int(frame[1, 1])


def make_stream(rng: np.random.Generator, n: int):
    """n transitions of random episodes with every kind of start a caller can produce.

    Starts: reset stacks of K copies (the env wrapper), distinct older frames, a partial run
    ([p, p, q, a]), and "jumps" while the previous episode is still open, including one whose
    newest frame equals the previous next_obs's newest frame (only the older frames differ).
    Each next_obs is obs shifted by one frame.  Yields (obs, action, reward, next_obs,
    terminated, truncated, reuse) where reuse asks the feeder to pass the previous next_obs
    object itself.
    """
    frames = Frames()
    out = []
    episode = 0
    prev_next = None
    while len(out) < n:
        episode += 1
        style = rng.choice(["copies", "copies", "distinct", "partial", "jump_same_newest"])
        if style == "jump_same_newest" and prev_next is not None:
            newest = prev_next[..., -1].copy()
            obs = stack([frames.new(episode, 2) for _ in range(K - 1)] + [newest])
        elif style == "distinct":
            obs = stack([frames.new(episode, 1) for _ in range(K - 1)] + [frames.new(episode)])
        elif style == "partial":
            p = frames.new(episode, 1)
            obs = stack([p, p, frames.new(episode, 1), frames.new(episode)])
        else:
            obs = stack([frames.new(episode)] * K)
        length = int(rng.integers(1, 12))
        end = rng.choice(["term", "trunc", "open"])  # "open": abandoned without an end flag
        for t in range(length):
            nxt = shifted(obs, frames.new(episode))
            last = t == length - 1
            out.append((obs, int(rng.integers(N_ACTIONS)), float(rng.normal()), nxt,
                        bool(last and end == "term"), bool(last and end == "trunc"), t > 0 and rng.random() < 0.7))
            obs = nxt
        prev_next = obs
    return out[:n]


class Reference:
    """Brute-force model: every transition added, and the global rows its stacks read.

    Layout it mirrors (documented in replay.py): a transition whose obs equals the previous
    next_obs of an open episode reuses that row; otherwise obs is written as a fresh history
    of the frames after the leading run of copies of its oldest frame; next_obs takes one row.
    A transition survives iff the oldest row it reads is among the last ``capacity`` written.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.rows_written = 0
        self.prev = None  # (next_obs, its global rows oldest..newest, episode ended)
        self.table = {}  # obs bytes -> (action, reward, next bytes, terminated, oldest row)

    def add(self, obs, a, r, nxt, term, trunc) -> None:
        if self.prev is not None and not self.prev[2] and np.array_equal(obs, self.prev[0]):
            obs_rows = self.prev[1]
        else:
            first = 0
            while first + 1 < K and np.array_equal(obs[..., first + 1], obs[..., 0]):
                first += 1
            g = self.rows_written
            obs_rows = [g] * (first + 1) + list(range(g + 1, g + K - first))
            self.rows_written += K - first
        next_rows = obs_rows[1:] + [self.rows_written]
        self.rows_written += 1
        key = obs.tobytes()
        assert key not in self.table  # the stream makes every obs stack unique
        self.table[key] = (a, np.float32(r), nxt.tobytes(), term, obs_rows[0])
        self.prev = (nxt, next_rows, term or trunc)

    def alive(self) -> set[bytes]:
        oldest_kept = self.rows_written - self.capacity
        return {key for key, value in self.table.items() if value[4] >= oldest_kept}


def feed(buf: ReplayBuffer, stream, ref: Reference | None = None, check=None) -> None:
    prev_next = None
    for obs, a, r, nxt, term, trunc, reuse in stream:
        if reuse and prev_next is not None and np.array_equal(obs, prev_next):
            obs = prev_next  # identity, as `obs = next_obs` in a real loop
        buf.add(obs, a, r, nxt, term, trunc)
        prev_next = nxt
        if ref is not None:
            ref.add(obs, a, r, nxt, term, trunc)
        if check is not None:
            check()


def valid_rows(buf: ReplayBuffer) -> np.ndarray:
    return np.flatnonzero(buf.state_dict()["flags"] & replay.VALID)


def check_batch(batch, table) -> set[bytes]:
    assert batch.observations.dtype == np.uint8 and batch.next_observations.dtype == np.uint8
    assert batch.observations.shape[1:] == OBS_SHAPE
    keys = set()
    for i in range(len(batch.actions)):
        key = batch.observations[i].tobytes()
        assert key in table, "sampled obs stack was never added"
        a, r, nxt, term, _ = table[key]
        assert (int(batch.actions[i]), batch.rewards[i], batch.terminated[i]) == (a, r, float(term))
        assert batch.next_observations[i].tobytes() == nxt
        keys.add(key)
    return keys


@pytest.mark.parametrize("capacity, steps", [(K + 1, 250), (7, 250), (50, 800)])
def test_round_trip_exact_against_brute_force(capacity, steps):
    stream = make_stream(np.random.default_rng(capacity), steps)
    buf = ReplayBuffer(capacity, OBS_SHAPE, np.uint8, N_ACTIONS, seed=0, frame_stack=K)
    ref = Reference(capacity)
    step = [0]

    def check():
        step[0] += 1
        alive = ref.alive()
        assert buf.size == min(ref.rows_written, capacity)
        assert buf.num_transitions == len(alive) == valid_rows(buf).size
        # Every stored transition, rebuilt: exactly the surviving ones, exactly as added.
        assert check_batch(buf.gather(valid_rows(buf)), ref.table) == alive
        if alive and step[0] % 5 == 0:
            assert check_batch(buf.sample(64), ref.table) <= alive
            np.testing.assert_array_equal(
                buf.sample_observations(0), np.empty((0, *OBS_SHAPE), np.uint8)
            )

    feed(buf, stream, ref, check)
    assert ref.rows_written > 10 * capacity  # many wraps
    assert len(ref.table) == steps


def test_stacks_never_cross_episode_boundaries():
    # Many episodes shorter than the stack: the padding must come from the reset frame.
    rng = np.random.default_rng(3)
    frames = Frames()
    buf = ReplayBuffer(40, OBS_SHAPE, np.uint8, N_ACTIONS, seed=1, frame_stack=K)
    for episode in range(60):
        reset = frames.new(episode)
        obs = stack([reset] * K)
        length = int(rng.integers(1, 6))
        for t in range(length):
            nxt = shifted(obs, frames.new(episode))
            buf.add(obs, 0, 0.0, nxt, t == length - 1, False)
            obs = nxt
    batch = buf.gather(valid_rows(buf))
    assert len(batch.actions) == buf.num_transitions > 0
    for obs, nxt in zip(batch.observations, batch.next_observations):
        episodes = {episode_of(s[..., j]) for s in (obs, nxt) for j in range(K)}
        assert len(episodes) == 1
        ids = [int(obs[0, 0, j]) + 256 * int(obs[0, 1, j]) for j in range(K)]
        assert ids == sorted(ids)  # oldest first; repeats only as reset padding
        assert len(set(ids)) == K or ids.count(ids[0]) == K - len(set(ids)) + 1


def test_bytes_per_row_is_one_frame_plus_fields():
    fields = 1 + 4 + 1  # uint8 action (6 actions), float32 reward, uint8 flags
    assert ReplayBuffer.bytes_per_row((84, 84, 4), np.uint8, 6, frame_stack=4) == 84 * 84 + fields
    assert ReplayBuffer.bytes_per_row((84, 84, 4), np.uint8, 6) == 84 * 84 * 4 + fields  # unchanged
    per = 84 * 84 + fields
    assert capacity_for_budget(per * 1000, (84, 84, 4), np.uint8, 6, frame_stack=4) == 1000
    with pytest.raises(UserError, match="at least 5"):
        capacity_for_budget(per * 4, (84, 84, 4), np.uint8, 6, frame_stack=4)
    buf = ReplayBuffer(10, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4)
    assert buf.nbytes == 10 * per
    assert buf.state_dict()["obs"].shape == (10, 84, 84)
    assert buf.frame_stack == 4 and buf.obs_shape == (84, 84, 4)


@pytest.mark.parametrize(
    "pattern, rows",
    [("aaaa", 1), ("abcd", 4), ("aabc", 3), ("abbb", 4), ("aaab", 2), ("abab", 4)],
)
def test_reset_stacks_stored_exactly(pattern, rows):
    frames = Frames()
    letters = {c: frames.new(0) for c in sorted(set(pattern))}
    obs = stack([letters[c] for c in pattern])
    nxt = shifted(obs, frames.new(0))
    buf = ReplayBuffer(16, OBS_SHAPE, np.uint8, N_ACTIONS, seed=0, frame_stack=K)
    buf.add(obs, 2, 1.5, nxt, False, False)
    assert buf.size == rows + 1  # older frames only where padding would not rebuild them
    assert buf.num_transitions == 1
    batch = buf.sample(3)
    for got_obs, got_next in zip(batch.observations, batch.next_observations):
        np.testing.assert_array_equal(got_obs, obs)
        np.testing.assert_array_equal(got_next, nxt)
    # Continuing with an equal copy reuses the row; a stack with the same newest frame but
    # other older frames does not.
    nxt2 = shifted(nxt, frames.new(0))
    buf.add(nxt.copy(), 1, 0.0, nxt2, False, False)
    assert buf.size == rows + 2
    other = stack([frames.new(1) for _ in range(K - 1)] + [nxt2[..., -1]])
    buf.add(other, 0, 0.0, shifted(other, frames.new(1)), True, False)
    assert buf.size == rows + 2 + K + 1
    table = {o.tobytes(): None for o in (obs, nxt, other)}
    assert {o.tobytes() for o in buf.sample(200).observations} == set(table)


def test_next_obs_must_be_obs_shifted_by_one_frame():
    frames = Frames()
    buf = ReplayBuffer(10, OBS_SHAPE, np.uint8, N_ACTIONS, seed=0, frame_stack=K)
    obs = stack([frames.new(0)] * K)
    reset_again = stack([frames.new(1)] * K)  # e.g. an autoreset env's obs at an episode end
    with pytest.raises(ValueError, match=r"shifted by one frame"):
        buf.add(obs, 0, 0.0, reset_again, True, False)
    assert buf.size == 0 and buf.num_transitions == 0  # nothing written
    buf.add(obs, 0, 0.0, shifted(obs, frames.new(0)), True, False)
    assert buf.size == 2


@pytest.mark.parametrize("split", [5, 17, 60])
def test_state_dict_round_trip_continues_identically(tmp_path, split):
    stream = make_stream(np.random.default_rng(7), 120)
    original = ReplayBuffer(23, OBS_SHAPE, np.uint8, N_ACTIONS, seed=9, frame_stack=K)
    feed(original, stream[:split])
    original.sample(7)

    path = tmp_path / "replay.npz"
    np.savez(path, **original.state_dict())
    restored = ReplayBuffer(23, OBS_SHAPE, np.uint8, N_ACTIONS, seed=12345, frame_stack=K)
    with np.load(path, allow_pickle=False) as data:
        assert int(data["frame_stack"]) == K
        restored.load_state_dict(dict(data))
    assert restored.num_transitions == original.num_transitions

    prev_next = stream[split - 1][3]
    for obs, a, r, nxt, term, trunc, _ in stream[split:]:
        original.add(prev_next if np.array_equal(obs, prev_next) else obs, a, r, nxt, term, trunc)
        restored.add(obs.copy(), a, r, nxt.copy(), term, trunc)  # value path after reload
        prev_next = nxt
        for x, y in zip(original.sample(16), restored.sample(16)):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(original.sample_observations(5), restored.sample_observations(5))
    for key, value in original.state_dict().items():
        np.testing.assert_array_equal(value, restored.state_dict()[key], err_msg=key)


def test_load_state_dict_checks_frame_stack():
    stacked = ReplayBuffer(10, OBS_SHAPE, np.uint8, N_ACTIONS, seed=0, frame_stack=K)
    plain = ReplayBuffer(10, FRAME, np.uint8, N_ACTIONS, seed=0)  # same obs array shape
    with pytest.raises(ValueError, match="frame_stack=4 but this buffer has frame_stack=1"):
        plain.load_state_dict(stacked.state_dict())
    old = dict(plain.state_dict())
    del old["frame_stack"]  # saved before frame stacking existed: counts as 1
    plain.load_state_dict(old)
    with pytest.raises(ValueError, match="frame_stack=1 but this buffer has frame_stack=4"):
        stacked.load_state_dict(old)


def test_bad_frame_stack_or_obs_shape_refused():
    with pytest.raises(ValueError, match=r"frame_stack=4 .*\(84, 84, 3\)"):
        ReplayBuffer(10, (84, 84, 3), np.uint8, 6, seed=0, frame_stack=4)
    with pytest.raises(ValueError, match=r"frame_stack=4 .*\(4, 84, 84\)"):
        ReplayBuffer(10, (4, 84, 84), np.uint8, 6, seed=0, frame_stack=4)  # channels-first
    with pytest.raises(ValueError, match="frame_stack must be >= 1, got 0"):
        ReplayBuffer(10, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=0)
    with pytest.raises(ValueError, match="frame_stack must be an integer"):
        ReplayBuffer(10, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4.0)
    with pytest.raises(ValueError, match=r"capacity=4 .*frame_stack=4.*capacity >= 5"):
        ReplayBuffer(4, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4)
    with pytest.raises(ValueError, match="frame_stack=2"):
        ReplayBuffer.bytes_per_row((84, 84, 4), np.uint8, 6, frame_stack=2)
    buf = ReplayBuffer(10, OBS_SHAPE, np.uint8, N_ACTIONS, seed=0, frame_stack=K)
    with pytest.raises(ValueError, match="shape"):
        buf.add(np.zeros(FRAME, np.uint8), 0, 0.0, np.zeros(OBS_SHAPE, np.uint8), False, False)


def test_memmap_backing(tmp_path, monkeypatch):
    path = tmp_path / "frames.bin"
    stream = make_stream(np.random.default_rng(11), 150)
    mapped = ReplayBuffer(30, OBS_SHAPE, np.uint8, N_ACTIONS, seed=4, frame_stack=K, memmap_path=path)
    in_ram = ReplayBuffer(30, OBS_SHAPE, np.uint8, N_ACTIONS, seed=4, frame_stack=K)
    assert isinstance(mapped.state_dict()["obs"], np.memmap)
    assert path.stat().st_size == 30 * 6
    assert mapped.nbytes == in_ram.nbytes
    feed(mapped, stream)
    feed(in_ram, stream)
    for x, y in zip(mapped.gather_n_step(mapped.sample_indices(50), 3, 0.9),
                    in_ram.gather_n_step(in_ram.sample_indices(50), 3, 0.9)):
        assert type(x) is np.ndarray  # copies, not views of the memmap
        np.testing.assert_array_equal(x, y)

    # Only the arrays kept in RAM count against available memory.
    monkeypatch.setattr(replay_budget.psutil, "virtual_memory", lambda: SimpleNamespace(available=1024**2))
    with pytest.raises(UserError):
        ReplayBuffer(2000, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4)  # 13.5 MiB of frames
    ReplayBuffer(2000, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4, memmap_path=tmp_path / "big.bin")


def test_memmap_refuses_file_that_does_not_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(replay_budget.shutil, "disk_usage", lambda _: SimpleNamespace(total=10**6, used=10**6 - 5000, free=5000))
    path = tmp_path / "frames.bin"
    with pytest.raises(UserError) as err:
        ReplayBuffer(1000, (84, 84, 4), np.uint8, 6, seed=0, frame_stack=4, memmap_path=path)
    msg = str(err.value)
    assert str(1000 * 84 * 84) in msg and "5000" in msg and str(path) in msg
    assert "memmap_path" in msg and "buffer_size" in msg and "\n" not in msg
    assert not path.exists()
    with pytest.raises(UserError, match="does not exist"):
        ReplayBuffer(10, OBS_SHAPE, np.uint8, 3, seed=0, frame_stack=K, memmap_path=tmp_path / "no" / "f.bin")


def test_a_minatar_transition_costs_one_frame():
    """The MinAtar recipes' 100k transitions of 10x10x4 uint8 frames: one frame a row (the next
    observation is the next row's), plus the action, reward and flags, never two float stacks."""
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.envs.environment import probe_env

    from conftest import MINATAR

    recipe = load_recipe(MINATAR)
    info = probe_env(recipe.env)
    buf = ReplayBuffer(recipe.train.buffer_size, info.obs_shape, info.obs_dtype, info.n_actions, seed=0)
    frame = int(np.prod(info.obs_shape))
    assert info.obs_dtype == np.uint8 and frame == 400
    assert frame < buf.nbytes / recipe.train.buffer_size < frame * 1.02
