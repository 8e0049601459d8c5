"""Pins ReplayBuffer's sampling and checkpoint contents to values recorded before the split into
ring / index / frame modules: same seed and adds must give the same indices, batches and state arrays."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from compress_dqn.replay.buffer import ReplayBuffer


def digest(*arrays: np.ndarray) -> str:
    """Short hash of dtypes, shapes and bytes: equal digests mean identical arrays."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def fill_flat(buf: ReplayBuffer, seed: int, n: int) -> None:
    """Random (2,) float32 episodes with term/trunc ends and occasional unrelated transitions."""
    rng = np.random.default_rng(seed)
    obs = rng.standard_normal(2).astype(np.float32)
    for _ in range(n):
        nxt = rng.standard_normal(2).astype(np.float32)
        u = rng.random()
        term, trunc = u < 0.08, 0.08 <= u < 0.12
        buf.add(obs, int(rng.integers(0, buf.n_actions)), float(rng.standard_normal()), nxt, term, trunc)
        if term or trunc or rng.random() < 0.05:  # new episode or an unrelated transition
            obs = rng.standard_normal(2).astype(np.float32)
        else:
            obs = nxt


def fill_frames(buf: ReplayBuffer, seed: int, n: int, distinct: bool = False) -> None:
    """Random frame-stack episodes: reset stacks, distinct-frame starts (all of them if distinct)."""
    rng = np.random.default_rng(seed)
    k = buf.frame_stack
    shape = buf.obs_shape[:-1]

    def frame() -> np.ndarray:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)

    def start() -> np.ndarray:
        if distinct or rng.random() < 0.3:
            return np.stack([frame() for _ in range(k)], axis=-1)
        f = frame()
        return np.stack([f] * k, axis=-1)

    obs = start()
    for _ in range(n):
        nxt = np.concatenate([obs[..., 1:], frame()[..., None]], axis=-1)
        u = rng.random()
        term, trunc = u < 0.08, 0.08 <= u < 0.12
        buf.add(obs, int(rng.integers(0, buf.n_actions)), float(rng.standard_normal()), nxt, term, trunc)
        obs = start() if (distinct or term or trunc) else nxt


def record() -> dict:
    """Indices, batch digests and state digests of three buffers: flat, frame stacks, sparse
    (few VALID rows, so sample_indices takes its enumerate fallback)."""
    out = {}
    for name, make, fill in (
        ("flat", lambda: ReplayBuffer(50, (2,), np.float32, 3, seed=123), lambda b: fill_flat(b, 1, 140)),
        ("frames", lambda: ReplayBuffer(40, (3, 2, 4), np.uint8, 5, seed=7, frame_stack=4),
         lambda b: fill_frames(b, 2, 120)),
        ("sparse", lambda: ReplayBuffer(40, (3, 2, 4), np.uint8, 5, seed=9, frame_stack=4),
         lambda b: fill_frames(b, 3, 30, True)),
    ):
        buf = make()
        fill(buf)
        state = buf.state_dict()
        r = {
            "num_transitions": buf.num_transitions,
            "size": buf.size,
            "state": {k: digest(v) for k, v in state.items()},
        }
        r["indices"] = buf.sample_indices(12).tolist()
        b = buf.sample(6)
        r["sample"] = digest(*b[:5])
        idx = buf.sample_indices(10)
        r["nstep_indices"] = idx.tolist()
        nb = buf.gather_n_step(idx, 3, 0.9)
        r["nstep"] = digest(*nb)
        r["observations"] = digest(buf.sample_observations(5))
        buf2 = make()
        buf2.load_state_dict(state)
        r["reloaded_indices"] = buf2.sample_indices(12).tolist()
        out[name] = r
    return out


RECORDED = {
    "flat": {
        "num_transitions": 42,
        "size": 50,
        "state": {
            "obs": "8dc668dc334729fc",
            "actions": "0bea6bc9c7dafc45",
            "rewards": "4afe7d1eec205862",
            "flags": "8bb9468bbb2ea380",
            "position": "8a22e43c62396417",
            "size": "dd25250d22f40cf8",
            "num_transitions": "91031c1d5e6eedf2",
            "episode_open": "a444fbc532241a64",
            "last_row": "a2f2801070a3b256",
            "frame_stack": "96d4915936ea48ba",
            "rng_state": "ee1b0604969d2987"
        },
        "indices": [
            0,
            34,
            29,
            2,
            45,
            12,
            16,
            8,
            17,
            40,
            22,
            22
        ],
        "sample": "547641d24c9b37e2",
        "nstep_indices": [
            10,
            25,
            12,
            8,
            0,
            24,
            0,
            29,
            20,
            18
        ],
        "nstep": "c8e24b0d41faaef4",
        "observations": "acf648f8d4102ba0",
        "reloaded_indices": [
            0,
            34,
            29,
            2,
            45,
            12,
            16,
            8,
            17,
            40,
            22,
            22
        ]
    },
    "frames": {
        "num_transitions": 27,
        "size": 40,
        "state": {
            "obs": "813833bef1b152d3",
            "actions": "f12a436fbea1cb5c",
            "rewards": "2797654572ad84e1",
            "flags": "07a42f48ab617089",
            "position": "a670b56d387ecc66",
            "size": "e067366d9488320f",
            "num_transitions": "2e2f067365fb29db",
            "episode_open": "bedf7958a3b9c1f1",
            "last_row": "c7f9588d66af2107",
            "frame_stack": "d66faad2e4ac2115",
            "rng_state": "f6bbfc6548a33e2d"
        },
        "indices": [
            37,
            25,
            27,
            35,
            23,
            33,
            34,
            36,
            19,
            32,
            5,
            4
        ],
        "sample": "00dcec34e49a92cd",
        "nstep_indices": [
            34,
            24,
            4,
            17,
            5,
            20,
            38,
            18,
            32,
            36
        ],
        "nstep": "f89a4f9d4e07b9ef",
        "observations": "02ac40dbb5a88a44",
        "reloaded_indices": [
            37,
            25,
            27,
            35,
            23,
            33,
            34,
            36,
            19,
            32,
            5,
            4
        ]
    },
    "sparse": {
        "num_transitions": 8,
        "size": 40,
        "state": {
            "obs": "e11e9a6387fdb013",
            "actions": "3e005b619233e284",
            "rewards": "424b80fe361f2c1f",
            "flags": "debf329604d5974b",
            "position": "8a71f72b10ee6125",
            "size": "e067366d9488320f",
            "num_transitions": "392e10e92d4623d9",
            "episode_open": "bedf7958a3b9c1f1",
            "last_row": "a670b56d387ecc66",
            "frame_stack": "d66faad2e4ac2115",
            "rng_state": "4dc5686d30919779"
        },
        "indices": [
            18,
            33,
            38,
            13,
            3,
            23,
            28,
            33,
            28,
            28,
            38,
            38
        ],
        "sample": "026d7f3f6d33a04d",
        "nstep_indices": [
            33,
            18,
            28,
            18,
            38,
            3,
            28,
            3,
            8,
            33
        ],
        "nstep": "0245d113c1987d23",
        "observations": "7e002c4c611207da",
        "reloaded_indices": [
            18,
            33,
            38,
            13,
            3,
            23,
            28,
            33,
            28,
            28,
            38,
            38
        ]
    }
}


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_matches_recorded(name: str) -> None:
    assert record()[name] == RECORDED[name]
