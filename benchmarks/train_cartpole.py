"""Train a recipe for given seeds and print one JSON line per seed.

    python benchmarks/train_cartpole.py --recipe recipes/cartpole.yaml --seeds 0 1 2 3
    python benchmarks/train_cartpole.py --recipe recipes/cartpole-zoo.yaml --seeds $(seq 0 19)
    python benchmarks/train_cartpole.py --smoke     # recipes/tiny.yaml, one seed, 300 steps: seconds

The last line counts the seeds whose final greedy return is >= --solved (475, CartPole's bar).

Each seed runs in a fresh process (so RSS is that run's alone) and reports train wall seconds,
env steps/s, gradient steps, the greedy mean return over the recipe's eval episodes (the kept
weights, evaluated as the pipeline does, on eval.seed..), peak RSS, and RSS at 50% and 100% of
training, or at its end when train.stop_at_return stops it sooner (the replay buffer is
preallocated, so the two should be equal). Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["train.total_timesteps=300", "train.eval_episodes=2"]


def rss_probe(total: int):
    """A training callback that records RSS when training passes 50% and 100% of its steps. Built here,
    in the process that trains: the parent that spawns one per seed never imports TensorFlow."""
    from compress_dqn.rl.callbacks import PhaseCallback

    class RssProbe(PhaseCallback):
        """Records RSS when training passes 50% and 100% of its steps."""

        def __init__(self, total: int) -> None:
            import psutil

            super().__init__()
            self.process = psutil.Process()
            self.marks = {"rss_50": total // 2, "rss_100": total}
            self.values: dict[str, int] = {}

        def _probe(self, step: int) -> None:
            for name, mark in self.marks.items():
                if name not in self.values and step >= mark:
                    self.values[name] = self.process.memory_info().rss

        def on_phase_end(self, logs=None) -> None:
            self._probe(int(logs["step"]))

        def on_train_end(self, logs=None) -> None:
            self._probe(int(logs["step"]))
            # train.stop_at_return can end training before total_timesteps: the last reading is its end.
            self.values.setdefault("rss_100", self.process.memory_info().rss)

    return RssProbe(total)


def one(recipe_path: str, seed: int, overrides: list[str]) -> dict:
    from compress_dqn.evaluation.play import evaluate
    from compress_dqn.rl.networks import NumpyActor
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.rl.trainer import DQNTrainer

    recipe = load_recipe(recipe_path, [*overrides, f"seed={seed}"])
    probe = rss_probe(recipe.train.total_timesteps)
    trainer = DQNTrainer.from_recipe(recipe.train, recipe.env, recipe.replay, seed=seed, callbacks=(probe,), quiet=True)
    result = trainer.train()
    stats = evaluate(NumpyActor(result.model).act, recipe.env, recipe.eval.episodes, recipe.eval.seed)
    rss_50, rss_100 = probe.values.get("rss_50"), probe.values.get("rss_100")
    return {
        "recipe": recipe_path,
        "seed": seed,
        "train_wall_seconds": round(result.wall_seconds, 2),
        "env_steps": result.env_steps,
        "env_steps_per_second": round(result.env_steps_per_second, 1),
        "gradient_steps": result.gradient_steps,
        "eval_episodes": recipe.eval.episodes,
        "eval_mean_return": round(stats.mean, 2),
        "selected_step": result.selected_step,
        "replay_nbytes": result.replay.nbytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_50pct_bytes": rss_50,
        "rss_100pct_bytes": rss_100,
        "rss_growth_50_to_100_pct": round(100.0 * (rss_100 - rss_50) / rss_50, 2) if rss_50 and rss_100 else None,
    }


def summary(rows: list[dict], solved_at: float) -> dict:
    """Solved count, mean and median final return, and mean speed over the seeds that ran."""
    import statistics

    returns = [r["eval_mean_return"] for r in rows if "eval_mean_return" in r]
    speeds = [r["env_steps_per_second"] for r in rows if "env_steps_per_second" in r]
    return {
        "summary": True,
        "seeds": len(rows),
        "failed": len(rows) - len(returns),
        "solved_at": solved_at,
        "solved": sum(r >= solved_at for r in returns),
        "mean_return": round(statistics.fmean(returns), 2) if returns else None,
        "median_return": round(statistics.median(returns), 2) if returns else None,
        "mean_env_steps_per_second": round(statistics.fmean(speeds), 1) if speeds else None,
        "mean_train_wall_seconds": round(statistics.fmean(r["train_wall_seconds"] for r in rows if "train_wall_seconds" in r), 1)
        if returns else None,
    }


def child_row(recipe: str, seed: int, overrides: list[str]) -> dict:
    """One seed trained in a fresh process: its result row, or {"seed", "error"} if it failed."""
    extra = [x for o in overrides for x in ("--set", o)]
    done = subprocess.run([sys.executable, __file__, "--recipe", recipe, "--one", str(seed), *extra],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"seed": seed, "error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_seeds(recipe: str, seeds: list[int], overrides: list[str], jobs: int, report=lambda row: None) -> list[dict]:
    """Train each seed in a fresh process (`jobs` at once); one result row per seed, in seed order."""
    from concurrent.futures import ThreadPoolExecutor

    rows = []
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        for row in pool.map(lambda seed: child_row(recipe, seed, overrides), seeds):
            report(row)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "cartpole.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at once (one process each)")
    parser.add_argument("--solved", type=float, default=475.0, help="final mean return that counts as solved")
    parser.add_argument("--smoke", action="store_true", help="recipes/tiny.yaml, seed 0, 300 steps: checks the script runs")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.recipe, args.seeds = str(ROOT / "recipes" / "tiny.yaml"), [0]
        args.overrides = [*SMOKE, *args.overrides]
    if args.one is not None:
        print(json.dumps(one(args.recipe, args.one, args.overrides)), flush=True)
        return
    rows = run_seeds(args.recipe, args.seeds, args.overrides, args.jobs, lambda row: print(json.dumps(row), flush=True))
    print(json.dumps({**summary(rows, args.solved), "recipe": args.recipe, "overrides": args.overrides}), flush=True)


if __name__ == "__main__":
    main()
