"""How many evaluation episodes one look worker plays per second for a TFLite policy: side by side
(play_unit today: one interpreter call per step for all of a chunk's running episodes) against one
episode at a time (run_episodes with TFLitePolicy.act, the player before), and against an older
checkout's play_unit; the returns compared episode by episode; the time split into environment,
interpreter and Python.

    python benchmarks/eval_throughput.py --policy RUN/seed-0/baseline/policy.tflite \\
        [--env MinAtar/Breakout-v1] [--max-episode-steps 10000] [--episodes 256] [--repeats 5] \\
        [--old-tree CHECKOUT] [--smoke]

Each timed run is a fresh process, as a pool worker is: it imports, plays a warm-up unit of two
episodes (a worker's first unit pays the imports, later ones do not), then times one
play_unit(env, policy, ..., first_seed, episodes) (at --smoke size one process plays every player of
this tree in turn: the smoke checks what they play, not how fast). The players take turns, run after run, so that
the machine's other work weighs on each alike; the medians are reported, with the load average.
`--old-tree` is a checkout of older code (e.g. `git worktree add /tmp/old a0e684b`): its play_unit
(compress_dqn.evaluation.play or, before, compress_dqn.run.looks) runs with that checkout first on
sys.path. Its returns are compared with each episode played alone (one play_unit call per seed,
in a fresh environment), since an older MinAtar player let an episode start with the previous
episode's last action (envs/environment.py reset_episode).

Prints one JSON line per timed run and a summary line (docs/evaluation-speed.md reads them).
Exits 1 if any player's returns differ from the others' on any episode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PLAYERS = ("side_by_side", "one_at_a_time", "old")
BREAKDOWNS = ("breakdown_side_by_side", "breakdown_one_at_a_time")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", type=Path, help="a .tflite policy written by compress-dqn")
    parser.add_argument("--env", default="MinAtar/Breakout-v1")
    parser.add_argument("--max-episode-steps", type=int, default=10000)
    parser.add_argument("--episodes", type=int, default=256, help="episodes in each timed unit")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--old-tree", type=Path, help="a checkout of older code whose play_unit to time as well")
    parser.add_argument("--smoke", action="store_true", help="6 episodes, one run each")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        for player in args.worker.split(","):
            print(json.dumps(worker(args, player)), flush=True)
        return
    if args.policy is None:
        parser.error("--policy is required")
    if args.smoke:
        args.episodes, args.repeats = 6, 1
    summary = compare(args)
    print(json.dumps(summary))
    sys.exit(0 if all(summary["identical"].values()) else 1)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """Time the players in turns, check their returns, and split the side-by-side player's time."""
    players = [p for p in PLAYERS if p != "old" or args.old_tree is not None]
    runs: dict[str, list[dict]] = {p: [] for p in players}
    # At --smoke size (one run each) one process plays today's players in turn: the smoke checks what they
    # play and report, not their timing, and a process start (imports, MinAtar's seaborn) costs more than a unit.
    smoked = spawn_many(args, [p for p in (*players, *BREAKDOWNS) if not p.startswith("old")]) if args.smoke else {}
    for repeat in range(args.repeats):
        for player in players[repeat % len(players):] + players[:repeat % len(players)]:
            run = smoked.get(player) or spawn(args, player)
            runs[player].append(run)
            print(json.dumps({"player": player, "repeat": repeat, "seconds": run["seconds"],
                              "episodes_per_s": round(args.episodes / run["seconds"], 1), "load": run["load"]}), flush=True)
    returns = {p: runs[p][0]["returns"] for p in players}
    identical = {"side_by_side == one_at_a_time": returns["side_by_side"] == returns["one_at_a_time"],
                 "every run of a player the same": all(r["returns"] == returns[p] for p in players for r in runs[p])}
    figures = {p: {"median_s": statistics.median(r["seconds"] for r in runs[p]),
                   "episodes_per_s": round(args.episodes / statistics.median(r["seconds"] for r in runs[p]), 1),
                   "runs_s": [r["seconds"] for r in runs[p]]} for p in players}
    summary: dict[str, Any] = {
        "policy": str(args.policy), "env": args.env, "episodes": args.episodes, "first_seed": args.first_seed,
        "mean_return": statistics.fmean(returns["side_by_side"]),
        "players": figures, "identical": identical,
        "speedup_vs_one_at_a_time": round(figures["one_at_a_time"]["median_s"] / figures["side_by_side"]["median_s"], 2),
        "load_average": [r["load"] for p in players for r in runs[p]],
        **{player: (smoked.get(player) or spawn(args, player))["breakdown"] for player in BREAKDOWNS},
    }
    summary["steps"] = summary["breakdown_side_by_side"]["steps"]
    if args.old_tree is not None:
        alone = spawn(args, "old_alone")["returns"]
        identical["side_by_side == old, each episode alone"] = returns["side_by_side"] == alone
        summary["old_tree"] = str(args.old_tree)
        summary["old_chunk_episodes_unlike_alone"] = sum(a != b for a, b in zip(returns["old"], alone))
        summary["speedup_vs_old"] = round(figures["old"]["median_s"] / figures["side_by_side"]["median_s"], 2)
    return summary


def spawn(args: argparse.Namespace, player: str) -> dict[str, Any]:
    """One worker process playing `player`'s unit; its JSON line."""
    return spawn_many(args, [player])[player]


def spawn_many(args: argparse.Namespace, players: list[str]) -> dict[str, dict[str, Any]]:
    """One worker process playing each of `players`' units in turn (all of today's tree or all of the old
    one's); their JSON lines by player."""
    player = players[0]
    tree = args.old_tree if player.startswith("old") else ROOT
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", ",".join(players), "--tree", str(tree),
               "--policy", str(args.policy), "--env", args.env, "--max-episode-steps", str(args.max_episode_steps),
               "--episodes", str(args.episodes), "--first-seed", str(args.first_seed)]
    env = dict(os.environ, PYTHONPATH=str(tree))
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{','.join(players)} worker failed:\n{done.stderr[-3000:]}")
    return dict(zip(players, [json.loads(line) for line in done.stdout.strip().splitlines()[-len(players):]]))


def worker(args: argparse.Namespace, player: str) -> dict[str, Any]:
    """In a fresh process with args.tree first on sys.path: play `player`'s unit, timed."""
    if str(args.tree) not in sys.path:
        sys.path.insert(0, str(args.tree))
    unit, env = unit_player(player)
    seeds = (args.first_seed, args.episodes)
    if player.startswith("breakdown"):
        return {"breakdown": breakdown(player, args.policy, env(args), *seeds)}
    if player == "old_alone":
        return {"returns": [unit(env(args), str(args.policy), first, 1)[0] for first in range(seeds[0], sum(seeds))]}
    unit(env(args), str(args.policy), 10**6, 2)  # the worker's first unit: imports, the environment's package
    started = time.perf_counter()
    returns = unit(env(args), str(args.policy), *seeds)
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 4), "returns": returns, "load": os.getloadavg()}


def unit_player(player: str):
    """(play_unit(env, tflite, n_actions, first_seed, count) without n_actions, the env argument's
    maker) for the tree on sys.path: today's, one episode at a time, or an older tree's."""
    if player == "one_at_a_time":
        from compress_dqn.deploy.litert.policy import TFLitePolicy
        from compress_dqn.envs.episodes import run_episodes

        def alone(env, tflite, first, count):
            return run_episodes(TFLitePolicy(Path(tflite)).act, env, range(first, first + count))

        return alone, env_config
    try:
        from compress_dqn.evaluation.play import play_unit
    except ImportError:  # before compress_dqn.evaluation: the unit lived with the looks, its env a dict
        from compress_dqn.run.looks import play_unit

        return (lambda env, tflite, first, count: play_unit(env, tflite, 0, first, count),
                lambda args: env_config(args).model_dump(mode="json"))
    return (lambda env, tflite, first, count: play_unit(env, tflite, 0, first, count)), env_config


def env_config(args: argparse.Namespace):
    from compress_dqn.recipe.schema import EnvConfig

    return EnvConfig(id=args.env, max_episode_steps=args.max_episode_steps)


def breakdown(player: str, tflite: Path, env, first: int, count: int) -> dict[str, Any]:
    """Where a unit's time goes, from one run with every environment and interpreter call timed
    (the timers add a little to each): seconds in the environment (stepping and starting
    episodes), in LiteRT (set_tensor, invoke, get_tensor), and the rest (the player's Python)."""
    from compress_dqn.deploy.litert.policy import TFLitePolicy
    from compress_dqn.envs import episodes

    spent = {"environment": 0.0, "set_tensor": 0.0, "invoke": 0.0, "get_tensor": 0.0}
    policy = TFLitePolicy(tflite)
    for name in ("set_tensor", "invoke", "get_tensor"):
        setattr(policy, f"_{name}", timed(getattr(policy, f"_{name}"), spent, name))
    steps = [0]
    make_lanes, make_env = episodes.make_lanes, episodes.make_env_from
    try:
        return _timed_play(player, policy, env, first, count, spent, steps)
    finally:  # a smoke worker plays the other players after this one, with the module as it was
        episodes.make_lanes, episodes.make_env_from = make_lanes, make_env


def _timed_play(player: str, policy, env, first: int, count: int, spent: dict[str, float], steps: list[int]) -> dict[str, Any]:
    from compress_dqn.envs import episodes
    from compress_dqn.evaluation.play import play_policy

    if player == "breakdown_side_by_side":
        make_lanes = episodes.make_lanes
        episodes.make_lanes = lambda *a: TimedLanes(make_lanes(*a), spent, steps)
        play = lambda: play_policy(policy, env, range(first, first + count))  # noqa: E731
    else:
        make_env = episodes.make_env_from
        episodes.make_env_from = lambda *a, **k: TimedEnv(make_env(*a, **k), spent, steps)
        play = lambda: episodes.run_episodes(policy.act, env, range(first, first + count))  # noqa: E731
    play()  # warm-up: imports
    for key in spent:
        spent[key] = 0.0
    steps[0] = 0
    started = time.perf_counter()
    play()
    total = time.perf_counter() - started
    interpreter = spent["set_tensor"] + spent["invoke"] + spent["get_tensor"]
    seconds = {**spent, "interpreter": interpreter, "python": total - spent["environment"] - interpreter, "total": total}
    return {"steps": steps[0], "seconds": {k: round(v, 4) for k, v in seconds.items()},
            "us_per_step": {k: round(v / max(1, steps[0]) * 1e6, 2) for k, v in seconds.items()}}


def timed(call, spent: dict[str, float], key: str):
    def run(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - started
    return run


class TimedLanes:
    """Lanes whose start and step calls add to spent['environment']."""

    def __init__(self, lanes, spent: dict[str, float], steps: list[int]) -> None:
        self._lanes, self._steps = lanes, steps
        self.start = timed(lanes.start, spent, "environment")
        self._step = timed(lanes.step, spent, "environment")
        self.close = lanes.close

    @property
    def obs(self):
        return self._lanes.obs

    def step(self, actions, lanes):
        self._steps[0] += len(lanes)
        return self._step(actions, lanes)


class TimedEnv:
    """A gymnasium environment whose reset and step calls add to spent['environment']."""

    def __init__(self, env, spent: dict[str, float], steps: list[int]) -> None:
        self._env, self._steps = env, steps
        self.reset = timed(env.reset, spent, "environment")
        self._step = timed(env.step, spent, "environment")
        self.unwrapped, self.close = env.unwrapped, env.close

    def step(self, action):
        self._steps[0] += 1
        return self._step(action)


if __name__ == "__main__":
    main()
