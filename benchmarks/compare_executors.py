"""Run one multi-seed recipe on the local process pool and on Ray, then compare per-seed results.

    .venv/bin/python benchmarks/compare_executors.py --recipe recipes/sweep.yaml --out runs/compare

Prints one JSON line per engine (wall time) and one with the comparison: for every seed and
variant, the per-episode returns, action agreement and the exact TFLite bytes (SHA-256) must match.
Timings are not compared: they vary from run to run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path


def per_seed(run_dir: Path, seeds: list[int]) -> dict[str, dict]:
    out = {}
    for seed in seeds:
        seed_dir = run_dir / f"seed-{seed}"
        results = json.loads((seed_dir / "results.json").read_text())
        out[str(seed)] = {
            v["name"]: {
                "mean_return": v["return"]["mean"],
                "episodes": v["return"]["episodes"],
                "agreement": v["action_agreement"],
                "tflite_sha256": hashlib.sha256((seed_dir / v["artifacts"]["tflite"]).read_bytes()).hexdigest(),
            }
            for v in results["variants"]
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/sweep.yaml")
    parser.add_argument("--out", default="runs/compare-executors")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override key=value")
    args = parser.parse_args()

    from compress_dqn.pipeline import run_seeds
    from compress_dqn.recipe import load_recipe

    found = {}
    for executor in ("local", "ray"):
        recipe = load_recipe(args.recipe, [*args.overrides, f"executor={executor}"])
        seeds = list(recipe.seeds or [recipe.seed])
        start = time.perf_counter()
        run_seeds(recipe, Path(args.out) / executor, quiet=True, log=lambda m: None)
        wall = time.perf_counter() - start
        found[executor] = per_seed(Path(args.out) / executor, seeds)
        print(json.dumps({"executor": executor, "seeds": seeds, "wall_seconds": round(wall, 1)}), flush=True)
    same = found["local"] == found["ray"]
    summary = {
        seed: {name: v["mean_return"] for name, v in variants.items()} for seed, variants in found["local"].items()
    }
    print(json.dumps({"identical_per_seed_results": same, "mean_returns": summary}))


if __name__ == "__main__":
    main()
