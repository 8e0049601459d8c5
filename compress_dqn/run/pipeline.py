"""Runs one recipe: the baseline, its variants, the looks that decide them, measuring, results and report.

What lands where in the run directory is store/layout.py's (RunLayout). Every file is written
under a temporary name and renamed, so an interrupted run never leaves a half-written artifact
behind, and rerunning the same command picks up where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from compress_dqn.evaluation.figures import Compression
from compress_dqn.evaluation.serving.attach import attached
from compress_dqn.evaluation.report import write_report
from compress_dqn.evaluation.results import EvalPlan, RandomFigures, RunResults, SearchMark, VariantResult, save_results
from compress_dqn.evaluation.verdicts import paired_difference, summarize
from compress_dqn.recipe.schema import Recipe
from compress_dqn.run.baseline_stages import train_baseline
from compress_dqn.run.context import RunContext, open_run, run_stages
from compress_dqn.run.looks import RANDOM, decide
from compress_dqn.run.measuring import c_policy_note, measure_stages, policy_names, probe_memory
from compress_dqn.run.rundir import RunOutcome
from compress_dqn.run.variants import build_pool, build_variants, variant_workers
from compress_dqn.store import stage_keys as keys
from compress_dqn.store.layout import BASELINE
from compress_dqn.store.manifest import write_manifest
from compress_dqn.store.records import EvaluateRecord, ExportRecord, MeasureRecord, TrainRecord, VariantRecord


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


def finish_run(ctx: RunContext, search: SearchMark | None = None, workers: int = 1) -> RunResults:
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
    save_results(results, ctx.layout.results)
    write_report(ctx.layout.root)
    write_manifest(ctx.layout.root)
    return results


def collect_results(ctx: RunContext, episodes: dict[str, list[float]]) -> RunResults:
    """results.json from the finished stages' records and every policy's episode returns."""
    cfg, ranges, stages = ctx.recipe.eval, ctx.ranges, ctx.stages
    exported, evaluated = stages.get("export", ExportRecord), stages.get("evaluate", EvaluateRecord)
    measured = {name: stages.get(keys.measure(name), MeasureRecord) for name in policy_names(ctx.recipe)}
    variants = [_variant_result(BASELINE, exported, episodes[BASELINE], evaluated.action_agreement, 1.0, None,
                                measured[BASELINE])] + [
        _variant_result(v.name, built, episodes[v.name], built.action_agreement, built.action_agreement_decisive,
                        built.compression, measured[v.name])
        for v in ctx.recipe.variants if (built := stages.get(keys.variant(v.name), VariantRecord))
    ]
    for entry in variants[1:]:  # each variant against the baseline, episode by episode (non-inferiority)
        entry.return_vs_baseline = paired_difference(entry.returns.episodes, variants[0].returns.episodes,
                                                     cfg.tolerance, episodes[RANDOM], ranges.confidence)
    return RunResults(
        env_id=ctx.recipe.env.id,
        eval=EvalPlan(episodes=ranges.episodes, seed=ranges.seed, max_episodes=ranges.looks[-1], looks=ranges.looks,
                      confidence=ranges.confidence, tolerance=cfg.tolerance, heldout_seed=ranges.heldout_seed,
                      heldout_episodes=ranges.heldout_episodes),
        random=RandomFigures(returns=summarize(episodes[RANDOM])),
        train=stages.get("train", TrainRecord),
        gpu=measured[BASELINE].gpu_note or "visible",
        c_policy_note=c_policy_note(measured.values()),
        variants=variants,
        gpu_serving=attached(ctx.layout.gpu_figures, [v.name for v in variants]),  # kept by a rerun that extends the run
    )


def _variant_result(name: str, built: ExportRecord | VariantRecord, episodes: list[float], agreement: float,
                    decisive: float | None, compression: Compression | None, measured: MeasureRecord) -> VariantResult:
    """One policy's results: its build's records, and its returns over every episode it played."""
    return VariantResult(name=name, artifacts=built.artifacts.to_dict(), returns=summarize(episodes), size=built.size,
                         action_agreement=agreement, action_agreement_decisive=decisive, latency_us=measured.latency_us,
                         memory_bytes=measured.memory_bytes, micro=measured.micro, c_policy=measured.c_policy,
                         compression=compression)
