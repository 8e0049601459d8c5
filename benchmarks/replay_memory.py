"""Memory of a frame-stacked Atari-shaped replay buffer, filled completely; one JSON line.

    python benchmarks/replay_memory.py --capacity 100000 [--frame-stack 4] [--height 84 --width 84]
    python benchmarks/replay_memory.py --smoke      # 5,000 rows: seconds, what the test suite runs

Allocates ReplayBuffer(capacity, (H, W, k), uint8, 6 actions, frame_stack=k) and fills every row
with synthetic episodes holding the values a frame-stack env wrapper gives: random uint8 frames,
episodes of 500-3000 steps, a reset stack of k copies of the reset frame, each next_obs the obs
shifted by one frame.  One episode's frames at a time are generated (vectorised, in chunks) into
a (k-1+T, H, W) array, and the stacks are zero-copy channels-last windows of it.  Each frame
carries its id in its first 8 bytes and its CRC32 is recorded when added, so sampled stacks are
checked against what was added without keeping the frames (that bookkeeping costs 12 bytes per
row, and is in the RSS).  Reports the arrays' bytes per transition against one frame plus the
per-row fields (~1.0: one frame per transition, not k or 2k) and process RSS before allocation
and after filling (should grow ~linearly with capacity).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import psutil
from numpy.lib.stride_tricks import sliding_window_view

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compress_dqn.replay.buffer import ReplayBuffer  # noqa: E402

N_ACTIONS = 6
CHUNK = 256  # frames generated per rng call: vectorised, a few MiB of temporaries at most


def episode_frames(rng: np.random.Generator, first_id: int, length: int, k: int, shape: tuple[int, int]) -> np.ndarray:
    """(k-1 + length+1, H, W): k-1 copies of the reset frame, the reset frame, then length
    frames; frame j (after the padding) carries id first_id + j in its first 8 bytes."""
    n = length + 1
    out = np.empty((k - 1 + n, *shape), np.uint8)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        block = out[k - 1 + lo : k - 1 + hi]
        block[...] = rng.integers(0, 256, size=block.shape, dtype=np.uint8)
        ids = np.arange(first_id + lo, first_id + hi, dtype="<u8")
        block.reshape(hi - lo, -1)[:, :8] = ids.view(np.uint8).reshape(-1, 8)
    out[: k - 1] = out[k - 1]
    return out


def frame_id(frame: np.ndarray) -> int:
    return int(np.ascontiguousarray(frame).reshape(-1)[:8].view("<u8")[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, help="rows (required unless --smoke)")
    parser.add_argument("--smoke", action="store_true", help="5,000 rows unless --capacity: checks the script runs")
    parser.add_argument("--frame-stack", type=int, default=4)
    parser.add_argument("--height", type=int, default=84)
    parser.add_argument("--width", type=int, default=84)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.capacity is None:
        if not args.smoke:
            parser.error("--capacity is required (or --smoke)")
        args.capacity = 5_000
    k, shape = args.frame_stack, (args.height, args.width)
    if args.height * args.width < 8:
        parser.error("frames need at least 8 pixels to carry their id")

    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    buf = ReplayBuffer(args.capacity, (*shape, k), np.uint8, N_ACTIONS, seed=args.seed, frame_stack=k)
    # Every frame added takes exactly one row here (reset stacks are k copies), so a filled
    # buffer has seen exactly `capacity` frames.
    crc = np.zeros(args.capacity, np.uint32)
    episode_start = np.zeros(args.capacity, np.int64)

    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    transitions = 0
    next_id = 0
    while buf.size < buf.capacity:
        start = next_id
        free_rows = buf.capacity - buf.size
        length = min(int(rng.integers(500, 3001)), free_rows - 1)
        if free_rows - (length + 1) == 1:
            length -= 1  # one spare row could hold no transition; leave two instead
        frames = episode_frames(rng, start, length, k, shape)
        stacks = sliding_window_view(frames, k, axis=0)  # (length+1, H, W, k), newest last
        episode_start[start : start + length + 1] = start
        crc[start] = zlib.crc32(frames[k - 1])
        obs = stacks[0]
        for t in range(1, length + 1):
            nxt = stacks[t]
            fid = start + t
            crc[fid] = zlib.crc32(frames[k - 1 + t])
            buf.add(obs, fid % N_ACTIONS, float(fid % 7), nxt, t == length, False)
            obs = nxt
        next_id += length + 1
        transitions += length
        del frames, stacks, obs, nxt
    fill_seconds = time.perf_counter() - t0
    rss_after = proc.memory_info().rss
    assert buf.size == buf.capacity == next_id

    # Rebuilt stacks must be exactly the frames added: ids newest-last, padded with the reset
    # frame at an episode start, each frame's bytes as recorded, the next stack shifted by one.
    for _ in range(4):
        batch = buf.sample(32)  # n-step discounts are None here: take the 1-step fields by name
        for obs, a, r, nxt, term in zip(batch.observations, batch.actions, batch.rewards,
                                        batch.next_observations, batch.terminated):
            newest = frame_id(obs[..., -1])
            ids = [max(int(episode_start[newest]), newest - (k - 1) + m) for m in range(k)]
            assert [frame_id(obs[..., m]) for m in range(k)] == ids, "obs stack is not what was added"
            assert [frame_id(nxt[..., m]) for m in range(k)] == [*ids[1:], newest + 1], "bad next stack"
            for stack in (obs, nxt):
                for m in range(k):
                    f = np.ascontiguousarray(stack[..., m])
                    assert zlib.crc32(f) == crc[frame_id(f)], "frame bytes differ from those added"
            assert int(a) == (newest + 1) % N_ACTIONS and r == float((newest + 1) % 7)
            ends = newest + 2 == args.capacity or episode_start[newest + 2] == newest + 2
            assert term == float(ends), "terminated flag differs from the one added"

    frame_bytes = args.height * args.width
    overhead = ReplayBuffer.bytes_per_row((*shape, k), np.uint8, N_ACTIONS, frame_stack=k) - frame_bytes
    per_transition = buf.nbytes / buf.capacity
    print(json.dumps({
        "capacity": buf.capacity,
        "frame_stack": k,
        "nbytes": buf.nbytes,
        "bytes_per_transition": per_transition,
        "frame_bytes": frame_bytes,
        "overhead_bytes": overhead,
        "ratio_vs_frame_plus_fields": round(per_transition / (frame_bytes + overhead), 6),
        "rows_per_transition": round(buf.size / buf.num_transitions, 6),
        "num_transitions": buf.num_transitions,
        "rss_bytes": rss_after,
        "rss_before_bytes": rss_before,
        "fill_seconds": round(fill_seconds, 3),
    }))


if __name__ == "__main__":
    main()
