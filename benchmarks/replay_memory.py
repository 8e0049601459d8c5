"""Memory and sampling time of a replay buffer filled with real Atari frames; one JSON line.

    python benchmarks/replay_memory.py --game Breakout --capacity 100000 [--compress CODEC|default]
    python benchmarks/replay_memory.py --smoke      # Pong, 3,000 rows, compressed: what the tests run

Plays ALE/<game>-v5 with uniformly random actions through the project's Atari preprocessing
(compress_dqn.envs.environment.make_env with recipes/pong.yaml's settings: no-op starts, frame
skip 4, 84x84 grayscale, 4 stacked frames) and adds each step to a ReplayBuffer of `capacity`
rows the way the trainer does (obs = next_obs, reset at an episode's end) until every row is
written.  It reports:

- bytes_per_transition: the filled buffer's bytes (payload + allowance per stored object +
  per-row fields: ReplayBuffer.nbytes, not a preallocated budget) over its sampleable transitions;
- rss_bytes / rss_added_bytes: the process's resident memory after filling, and what building and
  filling the buffer added to it (the environment is made before the first reading);
- sample_us (and sample_us_min, the fastest batch): median wall time of one batch of 32 four-frame
  stacks with their next stacks (ReplayBuffer.gather on pre-drawn indices, decoding included: it
  runs on the caller's thread); sample_cpu_us: its mean CPU time, which other jobs on a shared
  machine do not inflate;
- with --codecs instead: for the first `capacity` frames of play, the mean bytes a frame compresses
  to and the microseconds to compress and decompress one, for the codecs this choice was made
  among (zstd levels, lz4, blosc2 where installed; each frame alone or XORed with its group's key,
  as replay.compress stores it), and RLlib's LZ4 packing of a transition's two stacks;
- with --compress, unless --no-compare: an uncompressed buffer with the same rows (decoded from
  the compressed one after the RSS reading), timed back to back on the same indices
  (uncompressed_sample_us, sample_ratio, and the same for the fastest batches), and whether every
  timed batch was bit-identical.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compress_dqn.envs.environment import make_env  # noqa: E402
from compress_dqn.recipe.schema import AtariConfig  # noqa: E402
from compress_dqn.replay.buffer import ReplayBuffer, uncompressed_state  # noqa: E402
from compress_dqn.replay.packed import CODEC, GROUP  # noqa: E402

ATARI = AtariConfig(noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False)  # recipes/pong.yaml
BATCH = 32


def fill(buf: ReplayBuffer, env: Any, seed: int) -> int:
    """Play random actions into buf until every row is written; the env steps taken."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    steps = 0
    while buf.size < buf.capacity or steps < buf.capacity:
        action = int(rng.integers(env.action_space.n))
        nxt, reward, terminated, truncated, _ = env.step(action)
        buf.add(obs, action, float(reward), nxt, terminated, truncated)
        steps += 1
        obs = env.reset()[0] if terminated or truncated else nxt
    return steps


def time_batches(buffers: list[ReplayBuffer], indices: list[np.ndarray]) -> tuple[list[list[float]], list[float], bool]:
    """Wall microseconds of each batch of each buffer on the same indices, alternating buffers
    batch by batch so both see the same machine load; each buffer's mean CPU microseconds a batch
    (this thread's, which a busy machine does not inflate by preempting it); and whether all
    batches were identical."""
    times: list[list[float]] = [[] for _ in buffers]
    cpu = [0.0 for _ in buffers]
    identical = True
    for idx in indices:
        batches = []
        for n, buf in enumerate(buffers):
            t0, c0 = time.perf_counter(), time.thread_time()
            batches.append(buf.gather(idx))
            times[n].append((time.perf_counter() - t0) * 1e6)
            cpu[n] += (time.thread_time() - c0) * 1e6 / len(indices)
        first = batches[0]
        for other in batches[1:]:
            identical &= all(np.array_equal(a, b) for a, b in zip(first[:5], other[:5]))
    return times, cpu, identical


def summary(name: str, times: list[float]) -> dict[str, float]:
    """Median and fastest batch: on a shared machine a batch that loses its core mid-way inflates
    the median, and more so for the longer (compressed) batches; the fastest is the cost itself."""
    return {name: round(float(np.median(times)), 1), f"{name}_min": round(float(np.min(times)), 1)}


def play_frames(env: Any, n: int, seed: int) -> np.ndarray:
    """The first n frames of random play, (n, 84, 84): each stack's newest frame, resets included."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    frames = [obs[..., -1]]
    while len(frames) < n:
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            obs, _ = env.reset()
        frames.append(obs[..., -1])
    return np.stack(frames)


def _codecs() -> dict[str, tuple[Any, Any]]:
    """name -> (compress, decompress) of one frame's bytes; lz4 and blosc2 only where installed."""
    import zstandard

    found = {}
    for level in (1, 3, 6):
        cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
        found[f"zstd-{level}"] = (cctx.compress, dctx.decompress)
    try:
        import lz4.block

        found["lz4"] = (lambda b: lz4.block.compress(b, store_size=False),
                        lambda b: lz4.block.decompress(b, uncompressed_size=84 * 84))
    except ImportError:
        pass
    try:
        import blosc2

        found["blosc2-zstd-5"] = (lambda b: blosc2.compress(b, typesize=1, clevel=5, codec=blosc2.Codec.ZSTD),
                                  blosc2.decompress)
    except ImportError:
        pass
    return found


def codec_rows(game: str, frames: np.ndarray, group: int) -> list[dict[str, Any]]:
    """Bytes and microseconds per frame for each codec, frames alone and XORed with their group's key."""
    keyed = frames ^ frames[(np.arange(len(frames)) // group) * group]
    keyed[::group] = frames[::group]
    rows = []
    for name, (compress, decompress) in _codecs().items():
        for layout, data in (("alone", frames), (f"xor-key-{group}", keyed)):
            t0 = time.perf_counter()
            blobs = [compress(f.tobytes()) for f in data]
            t1 = time.perf_counter()
            for blob in blobs:
                decompress(blob)
            t2 = time.perf_counter()
            rows.append({"game": game, "codec": name, "layout": layout, "frames": len(data),
                         "bytes_per_frame": round(float(np.mean([len(b) for b in blobs])), 1),
                         "compress_us": round((t1 - t0) / len(data) * 1e6, 1),
                         "decompress_us": round((t2 - t1) / len(data) * 1e6, 1)})
    return rows


def rllib_bytes(frames: np.ndarray) -> dict[str, Any] | None:
    """A transition as RLlib's compress_observations packs it (ray.rllib.utils.compression.pack:
    LZ4 frame, then base64), obs and new_obs stacks both; None without lz4."""
    try:
        import base64

        import lz4.frame
    except ImportError:
        return None
    stacks = (np.ascontiguousarray(np.moveaxis(frames[i : i + 4], 0, -1)) for i in range(len(frames) - 3))
    packed = [len(base64.b64encode(lz4.frame.compress(s.tobytes()))) for s in stacks]
    return {"codec": "rllib-lz4-base64", "layout": "stack", "bytes_per_stack": round(float(np.mean(packed)), 1),
            "bytes_per_transition_obs_and_next": round(2 * float(np.mean(packed)), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default=None, help="ALE game, e.g. Breakout (ALE/<game>-v5); Pong with --smoke")
    parser.add_argument("--capacity", type=int, help="rows (required unless --smoke)")
    parser.add_argument("--compress", default=None, help=f"codec ({CODEC}) or 'default'; omitted: frames uncompressed")
    parser.add_argument("--no-compare", action="store_true", help="skip the uncompressed buffer (it needs 7 KB a row)")
    parser.add_argument("--batches", type=int, default=300, help="timed batches of 32")
    parser.add_argument("--codecs", action="store_true", help="compare codecs on the first --capacity frames instead")
    parser.add_argument("--smoke", action="store_true", help="Pong, 3,000 rows, compressed: checks the script runs")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.smoke:
        args.game, args.capacity = args.game or "Pong", args.capacity or 3000
        args.compress, args.batches = args.compress or "default", min(args.batches, 50)
    if args.game is None or args.capacity is None:
        parser.error("--game and --capacity are required (or --smoke)")
    codec = None if args.compress is None else (CODEC if args.compress == "default" else args.compress)

    env = make_env(f"ALE/{args.game}-v5", atari=ATARI, frame_stack=4)  # before the first RSS reading
    if args.codecs:
        frames = play_frames(env, args.capacity, args.seed)
        for row in [*codec_rows(args.game, frames, GROUP), rllib_bytes(frames)]:
            if row is not None:
                print(json.dumps({"game": args.game, **row}))
        return
    n_actions = int(env.action_space.n)
    proc = psutil.Process()
    rss_before = proc.memory_info().rss
    buf = ReplayBuffer(args.capacity, (84, 84, 4), np.uint8, n_actions, seed=args.seed, frame_stack=4, compress=codec)
    t0 = time.perf_counter()
    steps = fill(buf, env, args.seed)
    fill_seconds = time.perf_counter() - t0
    rss_after = proc.memory_info().rss
    env.close()
    indices = [buf.sample_indices(BATCH) for _ in range(args.batches)]
    row = {
        "game": args.game, "capacity": buf.capacity, "codec": codec or "none", "env_steps": steps,
        "num_transitions": buf.num_transitions, "nbytes": buf.nbytes,
        "bytes_per_transition": round(buf.nbytes / buf.num_transitions, 1),
        "rss_bytes": rss_after, "rss_added_bytes": rss_after - rss_before, "evicted_rows": buf.packed.evicted if buf.packed else 0,
        "fill_seconds": round(fill_seconds, 1),
    }
    if codec is None or args.no_compare:
        (times,), (cpu,), _ = time_batches([buf], indices)
        row.update({**summary("sample_us", times), "sample_cpu_us": round(cpu, 1)})
    else:
        plain = ReplayBuffer(buf.capacity, (84, 84, 4), np.uint8, n_actions, seed=0, frame_stack=4)
        plain.load_state_dict(uncompressed_state(buf))
        (times, plain_times), (cpu, plain_cpu), row["identical"] = time_batches([buf, plain], indices)
        row.update({**summary("sample_us", times), **summary("uncompressed_sample_us", plain_times),
                    "sample_cpu_us": round(cpu, 1), "uncompressed_sample_cpu_us": round(plain_cpu, 1),
                    "sample_cpu_ratio": round(cpu / plain_cpu, 3)})
        row["uncompressed_bytes_per_transition"] = round(plain.nbytes / plain.num_transitions, 1)
        row["sample_ratio"] = round(row["sample_us"] / row["uncompressed_sample_us"], 3)
        row["sample_ratio_min"] = round(row["sample_us_min"] / row["uncompressed_sample_us_min"], 3)
    print(json.dumps(row))


if __name__ == "__main__":
    main()
