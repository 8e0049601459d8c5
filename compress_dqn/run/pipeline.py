"""Runs one recipe: the baseline, its variants, the looks that decide them, measuring, results and report.

    run_dir/
      recipe.yaml            the resolved recipe (a rerun with a different recipe is refused)
      stages.json            finished stages and what they produced (a finished stage is not redone)
      baseline/weights.npz   the trained Q-network (npz, no pickle)
      baseline/heldout_obs.npz states from the baseline's evaluation episodes (for action agreement)
      baseline/replay.npz    the final replay buffer (calibration/distillation data for compression)
      baseline/checkpoints/  resumable training state while training runs
      baseline/saved_model/  slim SavedModel, serving_default: observations -> q_values, action
      baseline/policy.tflite fp32 TFLite with the same signature
      tensorboard/baseline/  TensorBoard scalars
      results.csv, report.md, report.html, *.png   the report (compress-dqn report re-renders it)
      results.json           schema_version 2 (latency_us.cpu and memory_bytes.cpu_rss per runtime;
                             gpu fields null with the reason in "gpu" where no GPU is visible)

Every file is written under a temporary name and renamed, so an interrupted run never leaves
a half-written artifact behind, and rerunning the same command picks up where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import JsonValue

from compress_dqn.evaluation.report import write_report
from compress_dqn.evaluation.results import EvalPlan, RandomFigures, RunResults, TrainFigures, VariantResult, save_results
from compress_dqn.evaluation.verdicts import paired_difference, sequential_plan, summarize
from compress_dqn.recipe.schema import Recipe
from compress_dqn.run.baseline_stages import train_baseline
from compress_dqn.run.context import RunContext, open_run, run_stages
from compress_dqn.run.looks import decide
from compress_dqn.run.manifest import write_manifest
from compress_dqn.run.measuring import measure_stages, probe_memory
from compress_dqn.run.rundir import RunOutcome
from compress_dqn.run.variants import build_pool, build_variants, variant_workers
from compress_dqn.store import stage_keys as keys


def run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunOutcome:
    """Train, export and evaluate the baseline and every variant of one recipe in run_dir.

    Resumes: training continues from its checkpoint, finished stages are skipped.
    """
    ctx, resumed = open_run(recipe, run_dir, quiet, log)
    workers = variant_workers(ctx)
    with build_pool(ctx, workers) as pool:  # its workers start while the baseline trains
        train_baseline(ctx)
        build_variants(ctx, workers, pool)
    return RunOutcome(run_dir=ctx.run_dir, results=finish_run(ctx, workers=workers), resumed=resumed)


def finish_run(ctx: RunContext, search: dict[str, Any] | None = None, workers: int = 1) -> RunResults:
    """Build what is left of ctx.recipe's variants (`workers` at once), decide their verdicts,
    probe every policy's memory not probed yet (`workers` at once; parallel builds probe their
    own), measure its timings (one at a time), then write results.json, the report and the
    manifest (last: its presence means finished)."""
    build_variants(ctx, workers)
    episodes = decide(ctx, workers=workers)  # more episodes where a verdict is still open
    probe_memory(ctx, workers)
    run_stages(ctx, measure_stages(ctx.recipe))
    results = collect_results(ctx, episodes)
    results.search = search
    save_results(results, ctx.run_dir / "results.json")
    write_report(ctx.run_dir)
    write_manifest(ctx.run_dir)
    return results


def collect_results(ctx: RunContext, episodes: dict[str, list[float]]) -> RunResults:
    """results.json from the finished stages and every policy's episode returns."""

    cfg, done = ctx.recipe.eval, ctx.stages.done
    plan, confidence = sequential_plan(cfg.episodes, cfg.max_episodes)
    variants = [_variant_result("baseline", done["export"], done["evaluate"], done[keys.measure("baseline")])] + [
        _variant_result(v.name, done[keys.variant(v.name)], done[keys.variant(v.name)], done[keys.measure(v.name)])
        for v in ctx.recipe.variants
    ]
    for entry in variants:
        entry.returns = summarize(episodes[entry.name])
    for entry in variants[1:]:  # each variant against the baseline, episode by episode (non-inferiority)
        entry.return_vs_baseline = paired_difference(entry.returns.episodes, variants[0].returns.episodes,
                                                     cfg.tolerance, episodes["random"], confidence)
    return RunResults(
        env_id=ctx.recipe.env.id,
        eval=EvalPlan(episodes=cfg.episodes, seed=cfg.seed, max_episodes=plan[-1], looks=plan, confidence=confidence,
                      tolerance=cfg.tolerance, heldout_seed=cfg.heldout_seed, heldout_episodes=cfg.heldout_episodes),
        random=RandomFigures(returns=summarize(episodes["random"])),
        train=TrainFigures.model_validate(done["train"]),
        gpu=done[keys.measure("baseline")]["gpu_note"] or "visible",
        variants=variants,
    )


def _variant_result(name: str, exported: dict[str, JsonValue], evaluated: dict[str, JsonValue],
                    measured: dict[str, JsonValue]) -> VariantResult:
    """A policy's entry from its stage outputs (stages.json's records, validated here)."""
    return VariantResult.model_validate({
        "name": name,
        "artifacts": exported["artifacts"],
        "return": evaluated["return"],
        "size": exported["size"],
        "action_agreement": evaluated["action_agreement"],
        "action_agreement_decisive": 1.0 if name == "baseline" else evaluated.get("action_agreement_decisive"),
        "latency_us": measured["latency_us"],
        "memory_bytes": measured["memory_bytes"],
        "micro": measured.get("micro"),
        "compression": exported.get("compression"),
    })
