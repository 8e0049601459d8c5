"""MinAtar Space Invaders in numpy lanes (envs/lanes.py SpaceInvadersLanes) against MinAtar's own
environment: the same episodes, seed by seed, and how fast a policy's evaluation plays with each.

    python benchmarks/spaceinvaders_lanes.py [--policy RUN/seed-0/baseline/policy.tflite] \\
        [--seeds 2000] [--episodes 512] [--repeats 5] [--first-seed 0] [--smoke]

The check: seeds first..first+seeds-1 played side by side (256 lanes, as play_unit plays them) in
SpaceInvadersLanes and in GymLanes (one MinAtar gymnasium environment per lane, built and reset
as every other player builds them), the same chooser on the same batches; per episode its return,
its length and a BLAKE2b hash of its whole observation stream (the first observation and the one
after every step, as uint8 bytes) must be the same in both.

The timing: `episodes` episodes on seeds first.. per timed run, in this process after a warm-up,
three players taking turns `repeats` times (medians of wall and of this process's CPU
seconds reported: on a shared machine the CPU seconds are the steadier figure): side by side in numpy lanes (what
play_unit plays now), side by side in GymLanes (the batching alone), and one episode at a time
(run_episodes with the policy's act, the player before side by side). Their returns must be the
same, episode by episode. benchmarks/eval_throughput.py times play_unit against one at a time in
fresh processes, as a pool worker plays (docs/evaluation-speed.md gives both).

The policy: a TFLite file (TFLitePolicy: actions() for a batch, act() for one row), or without
--policy a scripted player in numpy (under the nearest alien column, firing, out of the aliens'
bullets' way), which needs no training and no TensorFlow. Prints one JSON line per timed run, a
check line and a summary line; exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from compress_dqn.envs import episodes  # noqa: E402
from compress_dqn.envs.lanes import GymLanes, SpaceInvadersLanes, make_lanes  # noqa: E402
from compress_dqn.recipe.schema import EnvConfig  # noqa: E402

ENV = EnvConfig(id="MinAtar/SpaceInvaders-v1", max_episode_steps=10000)  # recipes/minatar-spaceinvaders.yaml's
WIDTH = 256  # evaluation/play.py's lanes
PLAYERS = ("numpy_lanes", "gym_lanes", "one_at_a_time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, help="a .tflite policy for MinAtar/SpaceInvaders-v1 (default: a scripted player)")
    parser.add_argument("--seeds", type=int, default=2000, help="episodes checked seed by seed")
    parser.add_argument("--episodes", type=int, default=512, help="episodes in each timed run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="24 seeds checked, 12 episodes timed once")
    args = parser.parse_args()
    if args.smoke:
        args.seeds, args.episodes, args.repeats = 24, 12, 1
    choose, act, name = load_policy(args.policy)
    checked = check(choose, range(args.first_seed, args.first_seed + args.seeds))
    print(json.dumps(checked), flush=True)
    timing = time_players(choose, act, range(args.first_seed, args.first_seed + args.episodes), args.repeats)
    summary = {"summary": True, "policy": name, "env": ENV.id, "max_episode_steps": ENV.max_episode_steps,
               "width": WIDTH, "cpu_count": os.cpu_count(), "load_average_after": os.getloadavg(), **timing,
               "checked_seeds": args.seeds, "identical": {**checked["identical"], **timing.pop("identical")}}
    print(json.dumps(summary))
    sys.exit(0 if all(summary["identical"].values()) else 1)


def load_policy(path: Path | None):
    """(choose(batch) -> actions, act(obs) -> action, a name) for a TFLite file or the scripted player."""
    if path is None:
        return scripted_actions, lambda obs: int(scripted_actions(obs[None])[0]), "scripted"
    from compress_dqn.deploy.litert.policy import TFLitePolicy

    policy = TFLitePolicy(path)
    return policy.actions, policy.act, str(path)


_COLUMNS = np.arange(10)


def scripted_actions(obs: np.ndarray) -> np.ndarray:
    """A Space Invaders player for a batch (no-op, left, right, fire): under the nearest alien column
    that none of its own bullets is flying up, firing, and out of the columns where the aliens'
    bullets come down (tests/test_lanes.py's hunter, row by row)."""
    rows = np.arange(len(obs))
    pos = obs[:, 9, :, 0].argmax(axis=1)
    free = obs[:, :, :, 1].any(axis=1) & ~obs[:, :, :, 4].any(axis=1)
    key = np.where(free, np.abs(_COLUMNS[None, :] - pos[:, None]) * 10 + _COLUMNS[None, :], 1000)
    target = key.argmin(axis=1)
    want = np.where(~free.any(axis=1), 0, np.where(target == pos, 3, np.where(target < pos, 1, 2)))
    danger = obs[:, 5:9, :, 5].any(axis=1) | obs[:, 8:10, :, 1].any(axis=1)
    lands = {0: pos, 1: np.maximum(pos - 1, 0), 2: np.minimum(pos + 1, 9), 3: pos}
    chosen = want.copy()
    decided = ~danger[rows, np.select([want == a for a in range(4)], [lands[a] for a in range(4)])]
    for a in (1, 2, 0):
        safe = ~decided & ~danger[rows, lands[a]]
        chosen[safe], decided = a, decided | safe
    return chosen


class Recording:
    """Lanes that keep each episode's return, length and observation-stream hash, by seed."""

    def __init__(self, lanes) -> None:
        self._lanes = lanes
        self._seed: dict[int, int] = {}
        self.episodes: dict[int, list] = {}  # seed: [return, length, hasher]

    @property
    def obs(self) -> np.ndarray:
        return self._lanes.obs

    def start(self, lane: int, seed: int) -> None:
        self._lanes.start(lane, seed)
        self._seed[lane] = seed
        self.episodes[seed] = [0.0, 0, hashlib.blake2b(self.obs[lane].astype(np.uint8).tobytes(), digest_size=16)]

    def step(self, actions: np.ndarray, lanes: np.ndarray):
        rewards, ended = self._lanes.step(actions, lanes)
        for k, lane in enumerate(lanes.tolist()):
            record = self.episodes[self._seed[lane]]
            record[0] += float(rewards[k])
            record[1] += 1
            record[2].update(self.obs[lane].astype(np.uint8).tobytes())
        return rewards, ended

    def close(self) -> None:
        self._lanes.close()


def play(choose, seeds, kind: str, record: bool = False):
    """play_side_by_side's returns with the lanes of `kind`: 'numpy_lanes' (make_lanes) or 'gym_lanes'."""
    made = make_lanes if kind == "numpy_lanes" else GymLanes
    recordings = []

    def lanes(env, width):
        built = made(env, width)
        assert isinstance(built, SpaceInvadersLanes) == (kind == "numpy_lanes"), type(built)
        if record:
            recordings.append(Recording(built))
            return recordings[-1]
        return built

    original = episodes.make_lanes
    episodes.make_lanes = lanes
    try:
        returns = episodes.play_side_by_side(lambda batch, _: choose(batch), ENV, seeds, WIDTH)
    finally:
        episodes.make_lanes = original
    return returns, (recordings[0].episodes if record else None)


def check(choose, seeds: range) -> dict[str, Any]:
    """Every seed's return, length and observation-stream hash in numpy lanes and in GymLanes."""
    played = {}
    for kind in ("numpy_lanes", "gym_lanes"):
        returns, recorded = play(choose, seeds, kind, record=True)
        played[kind] = {seed: (float(recorded[seed][0]), recorded[seed][1], recorded[seed][2].hexdigest()) for seed in seeds}
        assert [played[kind][seed][0] for seed in seeds] == returns
    numpy_lanes, gym_lanes = played["numpy_lanes"], played["gym_lanes"]
    differ = [seed for seed in seeds if numpy_lanes[seed] != gym_lanes[seed]]
    returns = [numpy_lanes[seed][0] for seed in seeds]
    lengths = [numpy_lanes[seed][1] for seed in seeds]
    return {"check": True, "seeds": [seeds.start, seeds.stop - 1], "episodes": len(seeds), "steps": sum(lengths),
            "mean_return": statistics.fmean(returns), "max_return": max(returns),
            "episodes_clearing_a_wave": sum(r >= 24 for r in returns),  # a wave is 24 aliens, a point each
            "episodes_at_the_fastest_aliens": sum(r >= 6 * 24 for r in returns),  # the ramp's end: 6 waves cleared
            "episodes_truncated": sum(n >= ENV.max_episode_steps for n in lengths),
            "mean_length": statistics.fmean(lengths), "max_length": max(lengths),
            "differing_seeds": differ[:20],
            "identical": {"numpy lanes == gym lanes: returns, lengths, observation hashes": not differ}}


def time_players(choose, act, seeds: range, repeats: int) -> dict[str, Any]:
    """The three players in turns, after a warm-up of each; medians and the returns compared."""
    players = {
        "numpy_lanes": lambda: play(choose, seeds, "numpy_lanes")[0],
        "gym_lanes": lambda: play(choose, seeds, "gym_lanes")[0],
        "one_at_a_time": lambda: episodes.run_episodes(act, ENV, seeds),
    }
    for player in players.values():  # warm-up: imports, first interpreter resizes
        player()
    runs: dict[str, list[float]] = {p: [] for p in PLAYERS}
    cpu: dict[str, list[float]] = {p: [] for p in PLAYERS}
    returns: dict[str, list[list[float]]] = {p: [] for p in PLAYERS}
    for repeat in range(repeats):
        for player in PLAYERS[repeat % 3:] + PLAYERS[:repeat % 3]:
            started, started_cpu = time.perf_counter(), time.process_time()
            returns[player].append(players[player]())
            runs[player].append(round(time.perf_counter() - started, 4))
            cpu[player].append(round(time.process_time() - started_cpu, 4))
            print(json.dumps({"player": player, "repeat": repeat, "seconds": runs[player][-1], "cpu_seconds": cpu[player][-1],
                              "episodes_per_s": round(len(seeds) / runs[player][-1], 1), "load": os.getloadavg()}), flush=True)
    median = {p: statistics.median(runs[p]) for p in PLAYERS}
    median_cpu = {p: statistics.median(cpu[p]) for p in PLAYERS}
    first = returns["numpy_lanes"][0]
    return {
        "episodes": len(seeds), "repeats": repeats, "mean_return": statistics.fmean(first),
        "players": {p: {"median_s": median[p], "episodes_per_s": round(len(seeds) / median[p], 1), "runs_s": runs[p],
                        "median_cpu_s": median_cpu[p], "episodes_per_cpu_s": round(len(seeds) / median_cpu[p], 1),
                        "runs_cpu_s": cpu[p]} for p in PLAYERS},
        "speedup_numpy_lanes_vs_one_at_a_time": round(median["one_at_a_time"] / median["numpy_lanes"], 2),
        "speedup_numpy_lanes_vs_gym_lanes": round(median["gym_lanes"] / median["numpy_lanes"], 2),
        "cpu_speedup_numpy_lanes_vs_one_at_a_time": round(median_cpu["one_at_a_time"] / median_cpu["numpy_lanes"], 2),
        "cpu_speedup_numpy_lanes_vs_gym_lanes": round(median_cpu["gym_lanes"] / median_cpu["numpy_lanes"], 2),
        "identical": {"timed players' returns, episode by episode, every run":
                      all(r == first for p in PLAYERS for r in returns[p])},
    }


if __name__ == "__main__":
    main()
