"""Several training seeds: one whole run per seed in RUN_DIR/seed-N, then the IQM aggregate."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from compress_dqn.envs.environment import probe_env
from compress_dqn.evaluation.report import write_report
from compress_dqn.evaluation.results import (ExecutorInfo, RunResults, SearchSummary, SeedAggregate, SeedsEval, SeedsResults,
                                             save_results)
from compress_dqn.evaluation.verdicts import iqm, stratified_bootstrap_ci
from compress_dqn.recipe.schema import Recipe, recipe_from_data
from compress_dqn.run import resources
from compress_dqn.run.baseline_stages import train_baseline
from compress_dqn.run.context import open_run, reopen_run
from compress_dqn.run.executors import map_units, threads_per_worker, worker_count
from compress_dqn.run.manifest import write_manifest
from compress_dqn.run.pipeline import finish_run, run
from compress_dqn.run.rundir import RunOutcome, prepare_run_dir


def aggregate_seeds(runs: list[RunResults]) -> list[SeedAggregate]:
    """Per variant, over training seeds: IQM of the per-seed mean returns with a stratified
    bootstrap CI, and the same for the per-seed difference to that seed's baseline."""

    out = []
    # A search drops a candidate at its first losing seed: aggregate what every seed played.
    for name in [v.name for v in runs[0].variants if all(v.name in {w.name for w in r.variants} for r in runs)]:
        entries = [r.variant(name) for r in runs]
        means = np.array([v.returns.mean for v in entries])
        # Paired, on the episodes the variant played: the seed's baseline mean covers the most
        # episodes any variant of that seed needed, which may be many more than this one played.
        diffs = np.array([v.return_vs_baseline.mean if v.return_vs_baseline else 0.0 for v in entries])
        out.append(SeedAggregate(
            name=name,
            per_seed_mean_return=means.tolist(),
            iqm_return=iqm(means),
            iqm_return_ci95=stratified_bootstrap_ci(means),
            iqm_difference_vs_baseline=iqm(diffs),
            difference_ci95=stratified_bootstrap_ci(diffs),
            per_seed_verdict=[v.label for v in entries],
            per_seed_episodes=[v.episodes for v in entries],
            tflite_gzip_bytes=int(np.median([v.size.tflite_gzip_bytes for v in entries])),
        ))
    return out


def run_seed_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool) -> dict[str, Any]:
    """One seed's whole pipeline, as an executor unit: plain data in, plain data out."""
    outcome = run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    return outcome.results.to_dict()


def baseline_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool) -> float:
    """One seed's baseline stages, as an executor unit. Returns the baseline's mean return."""
    ctx, _ = open_run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    train_baseline(ctx)
    return float(ctx.stages.done["evaluate"]["return"]["mean"])


def finish_unit(recipe_data: dict[str, Any], seed_dir: str, quiet: bool, search: dict[str, Any] | None) -> dict[str, Any]:
    """One seed's remaining stages and its results.json, as an executor unit."""
    ctx = reopen_run(recipe_from_data(recipe_data), Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    return finish_run(ctx, search).to_dict()


def seed_plan(recipe: Recipe) -> tuple[list[int], int, int]:
    """The training seeds, how many run at once, and TensorFlow threads per unit (the same on
    either engine, so per-seed results do not depend on the engine)."""

    seeds = list(recipe.seeds or [recipe.seed])
    workers = worker_count(len(seeds), recipe.workers)
    return seeds, workers, recipe.train.intra_op_threads or threads_per_worker(workers)


def seed_recipes(recipe: Recipe, run_dir: Path, threads: int) -> list[tuple[int, dict[str, Any], str]]:
    """(seed, that seed's single-seed recipe as data, its directory RUN_DIR/seed-N) per seed."""
    out = []
    for seed in recipe.seeds or [recipe.seed]:
        train = recipe.train.model_copy(update={"intra_op_threads": threads})
        single = recipe.model_copy(update={"seed": seed, "seeds": None, "train": train})
        out.append((seed, single.to_dict(), str(Path(run_dir) / f"seed-{seed}")))
    return out


def run_seeds(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Run the whole pipeline once per seed in RUN_DIR/seed-N (each resumable), then aggregate.

    Seeds run in parallel on recipe.executor (local process pool or Ray); each unit gets the same
    TensorFlow thread count on either engine, so per-seed results do not depend on the engine.
    """

    run_dir = Path(run_dir)
    seeds, workers, threads = seed_plan(recipe)
    info = probe_env(recipe.env)
    resources.check(resources.plan(recipe, info), run_dir, at_once=workers, in_total=len(seeds))
    resumed = prepare_run_dir(recipe, run_dir)
    parallel = workers > 1 or recipe.executor == "ray"
    units = [(data, seed_dir, quiet or parallel) for _, data, seed_dir in seed_recipes(recipe, run_dir, threads)]
    where = f"{recipe.executor}, {workers} at a time, {threads} TensorFlow thread(s) each"
    log(f"[seeds] {', '.join(map(str, seeds))} on {where}")
    runs = [RunResults.from_dict(data) for data in map_units(run_seed_unit, units, recipe.executor, workers, recipe.address)]
    for seed, seed_results in zip(seeds, runs):
        baseline = seed_results.baseline.returns
        log(f"[seed {seed}] baseline {baseline.mean:.1f} +/- {baseline.std:.1f}")
    return RunOutcome(run_dir=run_dir, results=write_seeds_results(recipe, run_dir, runs, workers, threads),
                      resumed=resumed)


def write_seeds_results(recipe: Recipe, run_dir: Path, runs: list[RunResults], workers: int, threads: int,
                        search: SearchSummary | None = None) -> SeedsResults:
    """The multi-seed results.json (aggregate over the seeds' runs), its report, then the manifest."""
    seeds = list(recipe.seeds or [recipe.seed])
    results = SeedsResults(
        env_id=recipe.env.id,
        eval=SeedsEval(episodes=recipe.eval.episodes, seed=recipe.eval.seed),
        seeds=seeds,
        executor=ExecutorInfo(kind=recipe.executor, workers=workers, intra_op_threads=threads),
        runs=[f"seed-{seed}/results.json" for seed in seeds],
        aggregate=aggregate_seeds(runs),
        search=search,
    )
    save_results(results, Path(run_dir) / "results.json")
    write_report(run_dir)
    write_manifest(run_dir)  # last: its presence means the run finished
    return results
