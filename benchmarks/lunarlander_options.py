"""Which standard DQN improvements pay off on LunarLander-v3: one JSON line per (option set, seed)
and a summary line per option set, from benchmarks/train_cartpole.py's per-seed runner.

    python benchmarks/lunarlander_options.py --seeds 0 1 2 --jobs 2
    python benchmarks/lunarlander_options.py --only zoo-256x256-100k n3-double-64x64-200k --seeds 0 1 2
    python benchmarks/lunarlander_options.py --smoke     # one option set, one seed, 300 steps: seconds

Each option set is a list of recipe overrides on recipes/lunarlander.yaml (the RL Zoo's DQN
hyperparameters with best-weights selection on held-out seeds). The final score is the kept
weights' mean over the recipe's 100 evaluation episodes (seeds 0..99, never used for selection);
"solved" is a mean >= 200. Every (option set, seed) pair is one fresh process, `--jobs` at once
(one TensorFlow thread each), so train wall seconds are per seed with one core each. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

_64 = ["train.net_arch=[64, 64]", "train.total_timesteps=2e5"]
_N3D = ["train.n_steps=3", "train.double_dqn=true"]
SMOKE = ["train.total_timesteps=300", "train.learning_starts=100", "train.buffer_size=1000",
         "train.eval_episodes=1", "train.eval_interval=0", "eval.episodes=2", "env.max_episode_steps=100"]


def _256(total_timesteps: str, gradient_steps: int) -> list[str]:
    """[256, 256] with K gradient steps per train_freq (4) env steps."""
    return ["train.net_arch=[256, 256]", f"train.total_timesteps={total_timesteps}", f"train.gradient_steps={gradient_steps}"]


OPTIONS: dict[str, list[str]] = {
    # The Zoo's DQN as published: [256, 256], 100k steps, one gradient step per env step.
    "zoo-256x256-100k": ["train.net_arch=[256, 256]", "train.total_timesteps=1e5", "train.n_steps=1",
                         "train.double_dqn=false"],
    # One core, one seed: a phase of 4 gradient steps (batch 128) costs ~1.3 ms with [64, 64],
    # ~2.2 ms with [128, 128] and ~7 ms with [256, 256]; an env step and its action ~0.15 ms.
    # So ~200 s buys 200k steps of [64, 64], 150k of [128, 128] at 4 gradient steps per 4 env
    # steps, or [256, 256] at one gradient step per 4 env steps (SB3's default gradient_steps: 1).
    "64x64-200k": _64 + ["train.n_steps=1", "train.double_dqn=false"],
    "double-64x64-200k": _64 + ["train.n_steps=1", "train.double_dqn=true"],
    "n3-64x64-200k": _64 + ["train.n_steps=3", "train.double_dqn=false"],
    "n3-double-64x64-200k": _64 + _N3D,
    "n3-double-linlr-64x64-200k": _64 + _N3D + ["train.learning_rate_schedule=linear"],
    "n3-double-eval20-64x64-200k": _64 + _N3D + ["train.eval_episodes=20"],
    "n3-double-128x128-150k": ["train.net_arch=[128, 128]", "train.total_timesteps=1.5e5"] + _N3D,
    "n3-double-256x256-gs1-250k": _256("2.5e5", 1) + _N3D,
    "n3-double-256x256-gs1-200k": _256("2e5", 1) + _N3D,
    "n3-double-eval20-256x256-gs1-200k": _256("2e5", 1) + _N3D + ["train.eval_episodes=20"],
    "double-256x256-gs1-200k": _256("2e5", 1) + ["train.n_steps=1", "train.double_dqn=true"],
    "n3-double-256x256-gs2-150k": _256("1.5e5", 2) + _N3D,
    # A dueling head (train.dueling) on the two sets that solved 3/3 in ~200 s.
    "double-dueling-64x64-200k": _64 + ["train.n_steps=1", "train.double_dqn=true", "train.dueling=true"],
    "n3-double-dueling-256x256-gs1-200k": _256("2e5", 1) + _N3D + ["train.dueling=true"],
    # The shipped recipe (n3, double, [256, 256], 150k steps, 4 gradient steps per 4 env steps).
    "shipped-256x256-150k": [],
}


def main() -> None:
    from train_cartpole import child_row, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "lunarlander.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=list(OPTIONS), help="option sets to run (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="(option set, seed) pairs trained at once")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra override for every option set")
    parser.add_argument("--smoke", action="store_true",
                        help="n3-double-64x64-200k for 300 steps, seed 0, 2 evaluation episodes: checks the script runs")
    args = parser.parse_args()
    if args.smoke:
        args.only, args.seeds = args.only or ["n3-double-64x64-200k"], [0]
        args.overrides = [*SMOKE, *args.overrides]
    names = args.only or list(OPTIONS)
    pairs = [(name, seed) for name in names for seed in args.seeds]

    def run(pair: tuple[str, int]) -> dict:
        name, seed = pair
        row = {"option": name, **child_row(args.recipe, seed, OPTIONS[name] + args.overrides)}
        print(json.dumps(row), flush=True)
        return row

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(run, pairs))
    for name in names:
        mine = [r for r in rows if r["option"] == name]
        print(json.dumps({"option": name, **summary(mine, 200.0), "overrides": OPTIONS[name] + args.overrides}),
              flush=True)


if __name__ == "__main__":
    main()
