"""Several training seeds: one whole run per seed in RUN_DIR/seed-N, then the IQM aggregate."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from compress_dqn.envs.environment import EnvInfo, probe_env
from compress_dqn.evaluation.findings import at_one_percent
from compress_dqn.evaluation.report import write_report
from compress_dqn.evaluation.results import (
    ExecutorInfo,
    RunResults,
    SearchMark,
    SearchSummary,
    SeedAggregate,
    SeedsEval,
    SeedsResults,
    save_results,
)
from compress_dqn.evaluation.verdicts import ONE_PERCENT, iqm, stratified_bootstrap_ci
from compress_dqn.recipe.schema import Recipe
from compress_dqn.run import resources
from compress_dqn.run.baseline_stages import train_baseline
from compress_dqn.run.context import open_run, reopen_run
from compress_dqn.run.executors import map_units, threads_per_worker, worker_count
from compress_dqn.run.pipeline import finish_run, run
from compress_dqn.run.rundir import RunOutcome, prepare_run_dir
from compress_dqn.store.layout import RunLayout
from compress_dqn.store.manifest import write_manifest
from compress_dqn.store.records import EvaluateRecord


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
        at_one = [at_one_percent(v) for v in entries]
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
            per_seed_at_one_percent=at_one if any(at_one) else None,
        ))
    return out


def run_seed_unit(recipe: Recipe, seed_dir: str, quiet: bool) -> RunResults:
    """One seed's whole pipeline, as an executor unit (pydantic records travel pickled)."""
    return run(recipe, Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print).results


def baseline_unit(recipe: Recipe, seed_dir: str, quiet: bool) -> float:
    """One seed's baseline stages, as an executor unit. Returns the baseline's mean return."""
    ctx, _ = open_run(recipe, Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    train_baseline(ctx)
    return float(ctx.stages.get("evaluate", EvaluateRecord).returns.mean)


def finish_unit(recipe: Recipe, seed_dir: str, quiet: bool, search: SearchMark | None) -> RunResults:
    """One seed's remaining stages and its results.json, as an executor unit."""
    ctx = reopen_run(recipe, Path(seed_dir), quiet=quiet, log=(lambda _: None) if quiet else print)
    return finish_run(ctx, search)


@dataclass(frozen=True)
class SeedRun:
    """One training seed of a run of several: its single-seed recipe and its directory RUN/seed-N."""

    seed: int
    recipe: Recipe
    layout: RunLayout


@dataclass(frozen=True)
class SeedsPlan:
    """A run of several seeds (or a search) after its prelude: the seeds' runs, how many run at once
    and with how many TensorFlow threads each (the same on either engine, so per-seed results do
    not depend on the engine), the probed environment, and whether the directory was resumed."""

    recipe: Recipe
    layout: RunLayout
    seeds: list[SeedRun]
    workers: int
    threads: int
    info: EnvInfo
    resumed: bool
    quiet: bool
    """Whether the units print nothing: the caller asked for quiet, or several run at once."""


def open_seeds(recipe: Recipe, run_dir: Path, quiet: bool = False) -> SeedsPlan:
    """The prelude of every run of several seeds: probe the environment (a bad id writes nothing),
    check memory and disk for the seeds that run at once and in total, then create or reopen
    run_dir (a single seed's run is opened by context.open_run)."""
    layout = RunLayout(Path(run_dir))
    seeds = list(recipe.seeds or [recipe.seed])
    workers = worker_count(len(seeds), recipe.workers)
    threads = recipe.train.intra_op_threads or threads_per_worker(workers)
    info = probe_env(recipe.env)
    resources.check(resources.plan(recipe, info), layout.root, at_once=workers, in_total=len(seeds))
    resumed = prepare_run_dir(recipe, layout.root)
    train = recipe.train.model_copy(update={"intra_op_threads": threads})
    runs = [SeedRun(seed, recipe.model_copy(update={"seed": seed, "seeds": None, "train": train}), layout.seed(seed))
            for seed in seeds]
    return SeedsPlan(recipe, layout, runs, workers, threads, info, resumed,
                     quiet or workers > 1 or recipe.executor == "ray")


def run_seeds(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Run the whole pipeline once per seed in RUN_DIR/seed-N (each resumable), then aggregate.

    Seeds run in parallel on recipe.executor (local process pool or Ray).
    """
    plan = open_seeds(recipe, run_dir, quiet)
    units = [(one.recipe, str(one.layout.root), plan.quiet) for one in plan.seeds]
    log(f"[seeds] {', '.join(str(one.seed) for one in plan.seeds)} on {recipe.executor}, {plan.workers} at a time, "
        f"{plan.threads} TensorFlow thread(s) each")
    runs = map_units(run_seed_unit, units, recipe.executor, plan.workers, recipe.address)
    for one, seed_results in zip(plan.seeds, runs):
        baseline = seed_results.baseline.returns
        log(f"[seed {one.seed}] baseline {baseline.mean:.1f} +/- {baseline.std:.1f}")
    return RunOutcome(run_dir=plan.layout.root, resumed=plan.resumed,
                      results=write_seeds_results(recipe, plan.layout.root, runs, plan.workers, plan.threads))


def write_seeds_results(recipe: Recipe, run_dir: Path, runs: list[RunResults], workers: int, threads: int,
                        search: SearchSummary | None = None) -> SeedsResults:
    """The multi-seed results.json (aggregate over the seeds' runs), its report, then the manifest."""
    seeds = list(recipe.seeds or [recipe.seed])
    results = SeedsResults(
        env_id=recipe.env.id,
        eval=SeedsEval(episodes=recipe.eval.episodes, seed=recipe.eval.seed,
                       tolerance=recipe.eval.tolerance if recipe.eval.tolerance > ONE_PERCENT else None),
        seeds=seeds,
        executor=ExecutorInfo(kind=recipe.executor, workers=workers, intra_op_threads=threads),
        runs=[f"seed-{seed}/results.json" for seed in seeds],
        aggregate=aggregate_seeds(runs),
        search=search,
    )
    save_results(results, RunLayout(Path(run_dir)).results)
    write_report(run_dir)
    write_manifest(run_dir)  # last: its presence means the run finished
    return results
