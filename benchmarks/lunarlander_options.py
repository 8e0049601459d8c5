"""Which standard DQN improvements pay off on LunarLander-v3: one JSON line per (option set, seed)
and a summary line per option set, from benchmarks/train_cartpole.py's per-seed runner.

    python benchmarks/lunarlander_options.py --seeds 0 1 2 --jobs 2
    python benchmarks/lunarlander_options.py --only zoo-256x256-100k n3-double-64x64-200k --seeds 0 1 2

Each option set is a list of recipe overrides on recipes/lunarlander.yaml (the RL Zoo's DQN
hyperparameters). The final score is the kept weights' mean over the recipe's 100 evaluation
episodes (seeds 0..99, never used for selection); "solved" is a mean >= 200. Not a test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

_64 = ["train.net_arch=[64, 64]", "train.total_timesteps=2e5"]
OPTIONS: dict[str, list[str]] = {
    # The Zoo's DQN as published: [256, 256], 100k steps, one gradient step per env step.
    "zoo-256x256-100k": ["train.net_arch=[256, 256]", "train.total_timesteps=1e5", "train.n_steps=1",
                         "train.double_dqn=false"],
    # On this 2-core CPU a [256, 256] update costs ~2.6 ms: 200 s buys ~70k of them. A [64, 64]
    # network costs ~0.75 ms, so 200k steps fit; [128, 128] ~1.4 ms, 120k steps.
    "64x64-200k": _64 + ["train.n_steps=1", "train.double_dqn=false"],
    "double-64x64-200k": _64 + ["train.n_steps=1", "train.double_dqn=true"],
    "n3-64x64-200k": _64 + ["train.n_steps=3", "train.double_dqn=false"],
    "n3-double-64x64-200k": _64 + ["train.n_steps=3", "train.double_dqn=true"],
    "n3-double-linlr-64x64-200k": _64 + ["train.n_steps=3", "train.double_dqn=true", "train.learning_rate_schedule=linear"],
    "n3-double-128x128-120k": ["train.net_arch=[128, 128]", "train.total_timesteps=1.2e5", "train.n_steps=3",
                               "train.double_dqn=true"],
}


def main() -> None:
    from train_cartpole import run_seeds, summary

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "lunarlander.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--only", nargs="+", choices=list(OPTIONS), help="option sets to run (default: all)")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (one process each)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="extra override for every option set")
    args = parser.parse_args()
    for name in args.only or list(OPTIONS):
        overrides = OPTIONS[name] + args.overrides
        rows = run_seeds(args.recipe, args.seeds, overrides, args.jobs,
                         lambda row, name=name: print(json.dumps({"option": name, **row}), flush=True))
        print(json.dumps({"option": name, **summary(rows, 200.0), "overrides": overrides}), flush=True)


if __name__ == "__main__":
    main()
