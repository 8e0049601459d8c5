"""Run one multi-seed recipe on the local process pool and on Ray, then compare per-seed results.

    .venv/bin/python benchmarks/compare_executors.py --recipe recipes/sweep.yaml --out runs/compare
    .venv/bin/python benchmarks/compare_executors.py --recipe recipes/tiny.yaml --search --out runs/compare-search
    .venv/bin/python benchmarks/compare_executors.py --recipe recipes/tiny.yaml --search --engines local:1 local:2
    .venv/bin/python benchmarks/compare_executors.py --smoke --out runs/compare-smoke   # tiny, one seed, local:1 vs local:2

With --search (or a recipe with a search: block) the search runs on each engine, and its winner,
front and every candidate's per-seed verdicts must match too.

Prints one JSON line per engine (wall time) and one with the comparison: for every seed and
variant, the per-episode returns, action agreement and the exact TFLite bytes (SHA-256) must match.
Timings are not compared: they vary from run to run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path


TINY_SEARCH = ["seeds=[0, 1]", "search.students=[[8], [2]]", "search.student_quantize=float16",
               "search.student_fine_tune.steps=300", "eval.tolerance=1.0"]
SMOKE = ["seeds=[0, 1]", "train.total_timesteps=300", "eval.episodes=2", "measure.saved_model_memory=none",
         "measure.c_policy=none", "variants=[{name: ptq-float16, quantize: {mode: float16}}]"]
"""--smoke: recipes/sweep.yaml's contract, shrunk: recipes/tiny.yaml on two seeds with one quick variant,
on a 2-worker local pool and on a local Ray (where ray is installed; else in one process); no
TensorFlow memory probe and no C cross-compile (the comparison leaves memory and C figures out)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="recipes/sweep.yaml")
    parser.add_argument("--out", default="runs/compare-executors")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override key=value")
    parser.add_argument("--search", action="store_true", help="add a tiny search (2 seeds, two students)")
    parser.add_argument("--engines", nargs="+", default=["local", "ray"],
                        help="engines to compare: local, ray, or local:N (the local pool with N workers; "
                             "local:1 runs every unit in one process, one after another)")
    parser.add_argument("--smoke", action="store_true",
                        help="recipes/tiny.yaml, two seeds, one variant, on local:2 and ray (local:1 without ray)")
    args = parser.parse_args()
    if args.smoke:
        args.recipe = str(Path(__file__).resolve().parent.parent / "recipes" / "tiny.yaml")
        args.engines = ["local:2", "ray" if importlib.util.find_spec("ray") else "local:1"]
        args.overrides = [*SMOKE, *args.overrides]
    if args.search:
        args.overrides = [*TINY_SEARCH, *args.overrides]

    from compress_dqn.store.manifest import run_fingerprint
    from compress_dqn.run.seeds import run_seeds
    from compress_dqn.recipe.schema import load_recipe
    from compress_dqn.run.search import run_search, search_fingerprint

    found = {}
    for engine in args.engines:
        executor, _, workers = engine.partition(":")
        placement = [f"executor={executor}"] + ([f"workers={workers}"] if workers else [])
        recipe = load_recipe(args.recipe, [*args.overrides, *placement])
        seeds = list(recipe.seeds or [recipe.seed])
        start = time.perf_counter()
        out = Path(args.out) / engine.replace(":", "-")
        (run_search if recipe.search else run_seeds)(recipe, out, quiet=True, log=lambda m: None)
        wall = time.perf_counter() - start
        found[engine] = search_fingerprint(out) if recipe.search else {
            str(seed): run_fingerprint(out / f"seed-{seed}") for seed in seeds}
        print(json.dumps({"engine": engine, "seeds": seeds, "wall_seconds": round(wall, 1)}), flush=True)
    first = args.engines[0]
    same = all(found[engine] == found[first] for engine in args.engines)
    summary = {}
    for seed in seeds:
        results = json.loads((Path(args.out) / first.replace(":", "-") / f"seed-{seed}" / "results.json").read_text())
        summary[seed] = {v["name"]: v["return"]["mean"] for v in results["variants"]}
    seeds_differ = None if recipe.search or len(seeds) < 2 else found[first][str(seeds[0])] != found[first][str(seeds[1])]
    print(json.dumps({"identical_per_seed_results": same, "seeds_differ": seeds_differ, "mean_returns": summary}))


if __name__ == "__main__":
    main()
