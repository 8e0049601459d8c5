"""Building variants: one stage each (build from the baseline, export, evaluate), candidates, and
parallel builds in a pool started while the baseline trains."""

from __future__ import annotations

import os
import shutil
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import NamedTuple

import numpy as np

from compress_dqn._tf import set_seed, tf_keras
from compress_dqn.compress.build import BuiltVariant, build_variant, build_variant_per_teacher
from compress_dqn.compress.recovery import build_cost
from compress_dqn.compress.details import BuildDetails
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.evaluation.figures import CandidatesPick, Compression, ReturnStats
from compress_dqn.evaluation.measure import measure_size
from compress_dqn.evaluation.play import evaluate
from compress_dqn.convert.conversion import convert_policy
from compress_dqn.fileio import replace_dir
from compress_dqn.recipe.schema import QatTeacher, Recipe, VariantConfig
from compress_dqn.replay.buffer import ReplayBuffer, load_replay
from compress_dqn.run import resources
from compress_dqn.run.context import RunContext, Stage, reopen_run, run_stages
from compress_dqn.run.executors import map_units, start_local_pool, worker_count
from compress_dqn.run.measuring import PROBE_ERRORS, probe_policy_memory, probes_saved_model
from compress_dqn.store import stage_keys as keys
from compress_dqn.store.layout import BASELINE, PolicyFiles, RunLayout
from compress_dqn.store.records import Artifacts, MemoryRecord, VariantRecord


def variant_seed(seed: int, name: str) -> int:
    """A variant's TensorFlow seed: stable across processes (crc32, not Python's salted hash)."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % 2**31


def _load_replay(path: Path, info: EnvInfo) -> ReplayBuffer:
    """The baseline's final replay buffer, fresh for each variant (so each is reproducible alone)."""
    return load_replay(path, info.obs_shape, info.obs_dtype, info.n_actions, frame_stack=info.frame_stack)


def _evaluate(tflite: Path, ctx: RunContext) -> tuple[ReturnStats, float, float]:
    """Return statistics on the shared episode seeds, and agreement with the baseline's actions
    (on every held-out state, and on the decisive ones)."""
    policy, seeds = TFLitePolicy(tflite), ctx.ranges.first
    baseline_actions, decisive = ctx.reference
    stats = evaluate(policy, ctx.recipe.env, len(seeds), seeds.start)
    actions = policy.actions(ctx.heldout)
    same = actions == baseline_actions
    return stats, float(np.mean(same)), float(np.mean(same[decisive]))


class BuildOutcome(NamedTuple):
    """What a variant's record keeps of its build: plain data, so that a candidate built in
    another process comes back with it."""

    params: int
    nonzero_params: int
    details: BuildDetails
    sparse_format: bool


def variant_stage(variant: VariantConfig, ctx: RunContext, candidate_workers: int = 1,
                  pool: ProcessPoolExecutor | None = None) -> VariantRecord:
    """Build one variant from the baseline (the best of its candidates where it has some), export
    it, evaluate it on the shared seeds. candidate_workers: processes that build its candidates
    side by side (local only; the bytes are the same for any number), in `pool` where given."""
    started = time.perf_counter()
    out = ctx.layout.policy(variant.name)
    if variant.candidates is None:
        built = _build_and_export(variant, ctx, out, ctx.layout.shared_pruning)
        picked = None
    else:
        built, picked = _pick_candidate(variant, ctx, out, candidate_workers, pool)
    size = measure_size(built.params, built.nonzero_params, out.tflite, out.saved_model)
    stats, agreement, decisive = _evaluate(out.tflite, ctx)
    ctx.log(f"[{variant.name}] return {stats.mean:.1f}, TFLite {size.tflite_bytes} bytes "
            f"({size.tflite_gzip_bytes} gzipped), agreement {agreement:.3f}")
    recipe_fields = variant.model_dump(mode="json", exclude_none=True, exclude={"name", "candidates"})
    compression = Compression(**{**recipe_fields, **built.details.to_dict()}, tflite_sparse_format=built.sparse_format,
                              build_seconds=round(time.perf_counter() - started, 1))  # with its evaluation
    if picked is not None:
        compression.candidates = picked
    return VariantRecord(artifacts=Artifacts(**ctx.layout.artifacts(variant.name)), size=size, returns=stats,
                         action_agreement=agreement, action_agreement_decisive=decisive, compression=compression)


def _build_and_export(variant: VariantConfig, ctx: RunContext, out: PolicyFiles, shared: Path | None) -> BuildOutcome:
    """Build `variant` from the baseline and export it into `out`."""
    baseline = _seeded(variant, ctx)
    built = build_variant(variant, baseline, _load_replay(ctx.layout.replay, ctx.info), ctx.recipe, ctx.info,
                          quiet=ctx.quiet, shared=shared)
    return _exported(built, ctx, out)


def _seeded(variant: VariantConfig, ctx: RunContext) -> tf_keras.Model:
    """The baseline, with TensorFlow reset and seeded for a build of `variant`."""
    baseline = ctx.model  # loaded (on first use) before the seed: loading draws initial weights
    # Fresh Keras name counters and a seed from the recipe and the variant's name alone: a variant
    # rebuilt after a crash, alone, or after other units in the same worker process gets the same
    # weights and the same layer (so TFLite tensor) names, hence the same bytes.
    tf_keras.backend.clear_session()
    set_seed(variant_seed(ctx.recipe.seed, variant.name))
    return baseline


def _exported(built: BuiltVariant, ctx: RunContext, out: PolicyFiles) -> BuildOutcome:
    exported = convert_policy(built.export_model, ctx.info, out.folder, built, ctx.heldout[:500])
    return BuildOutcome(built.params, built.nonzero_params, built.details, exported["sparse_format"])


def _build_candidate(variant: VariantConfig, ctx: RunContext, out: PolicyFiles,
                     teachers: list[QatTeacher] | None) -> list[BuildOutcome]:
    """One candidate build, exported into `out`; with `teachers` (candidates.qat_teachers), its
    float model QAT'd once per teacher, each exported into teacher_folder(out, teacher)."""
    if teachers is None:
        return [_build_and_export(variant, ctx, out, shared=None)]
    baseline = _seeded(variant, ctx)
    built = build_variant_per_teacher(variant, teachers, baseline, _load_replay(ctx.layout.replay, ctx.info),
                                      ctx.recipe, ctx.info, quiet=ctx.quiet)
    return [_exported(b, ctx, teacher_folder(out, t)) for b, t in zip(built, teachers)]


def teacher_folder(out: PolicyFiles, teacher: str) -> PolicyFiles:
    """Where a candidate's build QAT'd to `teacher` is exported: NAME.cK.TEACHER beside NAME.cK."""
    return PolicyFiles(out.folder.with_name(f"{out.folder.name}.{teacher}"))


def candidate_build_unit(recipe: Recipe, run_dir: str, variant: VariantConfig, folder: str,
                         teachers: list[QatTeacher] | None) -> list[BuildOutcome]:
    """One candidate's build(s) and export into `folder`, in a pool worker: the same threads and
    the same seed (from its name) as in the unit's own process, so the same bytes."""
    ctx = reopen_run(recipe, Path(run_dir), quiet=True, log=lambda _: None)  # sets the threads
    return _build_candidate(variant, ctx, PolicyFiles(Path(folder)), teachers)


def candidate_name(name: str, k: int) -> str:
    """Candidate k of variant `name`: built as a variant of that name would be (seeds follow it)."""
    return f"{name}.c{k}"


def _pick_candidate(variant: VariantConfig, ctx: RunContext, out: PolicyFiles, workers: int = 1,
                    pool: ProcessPoolExecutor | None = None) -> tuple[BuildOutcome, CandidatesPick]:
    """Build each of variant.candidates.count candidates into out/candidates/ (`workers` at once),
    play each and the baseline on the same fresh episodes, and move the best one's files into
    `out` (the first of equals). Returns its build and the pick's record for results.json.

    Why side by side: a search unit whose seed has the machine to itself (3 seeds on 2 cores)
    would otherwise build its candidates one after another with a core idle."""
    cfg = variant.candidates
    # No shared pruning: candidates that loaded one pruning would all be the same build.
    named = [variant.model_copy(update={"name": candidate_name(variant.name, k), "candidates": None})
             for k in range(cfg.count)]
    if workers > 1 and ctx.recipe.executor == "local":
        units = [(ctx.recipe, str(ctx.run_dir), v, str(out.candidate(v.name).folder), cfg.qat_teachers) for v in named]
        built = map_units(candidate_build_unit, units, "local", workers, pool=pool)
    else:
        built = [_build_candidate(v, ctx, out.candidate(v.name), cfg.qat_teachers) for v in named]
    files = [out.candidate(v.name) for v in named]
    if cfg.qat_teachers:
        files = [teacher_folder(f, t) for f in files for t in cfg.qat_teachers]
    builds = [b for each in built for b in each]

    def play(tflite: Path) -> np.ndarray:
        return np.asarray(evaluate(TFLitePolicy(tflite), ctx.recipe.env, cfg.episodes, cfg.seed).episodes)

    baseline = play(ctx.layout.policy(BASELINE).tflite)
    differences = [float(np.mean(play(f.tflite) - baseline)) for f in files]
    for f, difference in zip(files, differences):
        ctx.log(f"[{variant.name}] candidate {f.folder.name}: {difference:+.1f} against the baseline on "
                f"{cfg.episodes} fresh episodes")
    k = differences.index(max(differences))
    replace_dir(files[k].saved_model, out.saved_model)
    os.replace(files[k].tflite, out.tflite)
    shutil.rmtree(out.candidates)
    return builds[k], CandidatesPick(**cfg.model_dump(mode="json", exclude_none=True), picked=k,
                                     builds=[f.folder.name for f in files],
                                     fresh_differences=[round(d, 3) for d in differences])


def variant_stages(recipe: Recipe, candidate_workers: int = 1, pool: ProcessPoolExecutor | None = None) -> list[Stage]:
    """One stage per variant; each reads only the baseline's files, so it can run alone."""
    return [Stage(keys.variant(v.name), partial(variant_stage, v, candidate_workers=candidate_workers, pool=pool))
            for v in recipe.variants]


def variant_unit(recipe: Recipe, run_dir: str, variant: VariantConfig, quiet: bool) -> VariantRecord:
    """One variant stage in a pool worker. Returns its record for the run's own process to write
    (stages.json keeps one writer). Same TensorFlow threads and seeds as in that process, so the
    same bytes wherever it runs. Records and recipes are pydantic models: they travel to a worker
    and back (a process pool or Ray) pickled as the data they hold."""
    ctx = reopen_run(recipe, Path(run_dir), quiet=True, log=(lambda _: None) if quiet else print)  # sets the threads
    return variant_stage(variant, ctx)


def variant_and_memory_unit(recipe: Recipe, run_dir: str, variant: VariantConfig, quiet: bool,
                            saved_model: bool) -> tuple[VariantRecord, MemoryRecord | None]:
    """variant_unit, then the new policy's memory probe (stage memory:NAME) from the same worker. The
    probe is a fresh process whose peak RSS does not depend on what else runs, so it can overlap
    other builds rather than wait for all of them."""
    record = variant_unit(recipe, run_dir, variant, quiet)
    try:
        memory = probe_policy_memory(RunLayout(Path(run_dir)).policy(variant.name), saved_model)
    except PROBE_ERRORS:  # the build is kept; probe_memory tries again
        memory = None
    return record, memory


def unbuilt_variants(ctx: RunContext) -> list[VariantConfig]:
    """ctx.recipe's variants whose build stage has not finished."""
    return [v for v in ctx.recipe.variants if keys.variant(v.name) not in ctx.stages.done]


def build_variants(ctx: RunContext, workers: int = 1, pool: ProcessPoolExecutor | None = None) -> None:
    """Every variant stage not finished yet, `workers` at once (each variant reads only the
    baseline's files). Each is recorded as soon as it finishes, so a killed run keeps it.

    When they are built in a local pool, each worker also probes its variant's memory once built
    (a probe that fails is left to probe_memory), and the baseline's probe runs beside the
    builds, so the probes (a TensorFlow import each, for the SavedModel) overlap the builds instead
    of following them with a core idle (docs/executors.md). Ray units leave memory to
    probe_memory, so every policy's figure comes from the same machine. `pool`: a local pool
    started ahead (build_pool), else map_units starts one."""

    todo = unbuilt_variants(ctx)
    if workers <= 1 or len(todo) <= 1:  # a lone variant's candidates may still use the workers
        run_stages(ctx, variant_stages(ctx.recipe, candidate_workers=workers, pool=pool))
        return
    todo.sort(key=lambda v: -build_cost(v, ctx.recipe))  # costliest first (the pool starts them in order)
    units = [(ctx.recipe, str(ctx.run_dir), v, ctx.quiet) for v in todo]
    if ctx.recipe.executor != "local":
        map_units(variant_unit, units, ctx.recipe.executor, workers, ctx.recipe.address,
                  on_result=lambda i, built: ctx.stages.finish(keys.variant(todo[i].name), built))
        return

    units = [(*unit, probes_saved_model(ctx.recipe, v.name)) for unit, v in zip(units, todo)]

    def record(i: int, outputs: tuple[VariantRecord, MemoryRecord | None]) -> None:
        built, memory = outputs
        ctx.stages.finish(keys.variant(todo[i].name), built)
        if memory is not None and keys.measure(todo[i].name) not in ctx.stages:
            ctx.stages.finish(keys.memory(todo[i].name), memory)

    with ThreadPoolExecutor(1) as side:  # a thread: it waits on the probe's own process
        probing = [] if {keys.memory(BASELINE), keys.measure(BASELINE)} & set(ctx.stages.done) else [
            side.submit(probe_policy_memory, ctx.layout.policy(BASELINE), probes_saved_model(ctx.recipe, BASELINE))]
        map_units(variant_and_memory_unit, units, ctx.recipe.executor, workers, ctx.recipe.address,
                  on_result=record, pool=pool)
        for future in probing:
            try:
                ctx.stages.finish(keys.memory(BASELINE), future.result())
            except PROBE_ERRORS:
                pass  # probe_memory tries again after the looks


def variant_workers(ctx: RunContext) -> int:
    """Builds a single-seed run makes at once: `workers` (null: one per CPU), fewer where memory
    does not hold that many processes with the baseline's replay loaded. A variant's candidates
    count as builds: a lone variant built 3 times keeps 2 cores busy."""

    builds = sum(v.candidates.count if v.candidates else 1 for v in ctx.recipe.variants)
    wanted = worker_count(builds, ctx.recipe.workers)
    return resources.fits_at_once(resources.plan(ctx.recipe, ctx.info), wanted)


def warm_build_worker() -> None:
    """A build worker's imports, TensorFlow's among them. No TensorFlow op runs,
    so variant_unit can still set the worker's thread count."""
    import compress_dqn.compress.build  # noqa: F401
    import compress_dqn.deploy.litert.policy  # noqa: F401
    import compress_dqn.evaluation.verdicts  # noqa: F401
    import compress_dqn.convert.conversion  # noqa: F401


@contextmanager
def build_pool(ctx: RunContext, workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """The local pool that will build ctx's variants, started now so that its workers import
    TensorFlow while this process trains the baseline (one TensorFlow thread on the demo: a core
    stays free); None where builds do not run in a local pool. Started after training, each worker
    would spend its import time before its first build (docs/executors.md)."""

    todo = unbuilt_variants(ctx)
    if ctx.recipe.executor != "local" or workers <= 1 or len(todo) <= 1:
        yield None
        return
    with _shut_down_after(start_local_pool(min(workers, len(todo)), warm_build_worker)) as pool:
        yield pool


@contextmanager
def search_build_pool(recipe: Recipe, seeds: int, workers: int, rungs: list[VariantConfig]
                      ) -> Iterator[ProcessPoolExecutor | None]:
    """The local pool that builds a single-seed search's candidates, rung after rung: started once,
    while the baseline trains or is read, where each rung would otherwise start a pool of fresh
    processes (TensorFlow's import, the run reopened and tfmot's code converted again: seconds a
    rung). None where no rung builds candidates side by side in this process's pool: several
    seeds (each seed's unit is a worker of its own), Ray, one worker, or no rung with candidates."""
    if recipe.executor != "local" or seeds != 1 or workers <= 1 or not any(v.candidates for v in rungs):
        yield None
        return
    with _shut_down_after(start_local_pool(workers, warm_build_worker)) as pool:
        yield pool


@contextmanager
def _shut_down_after(pool: ProcessPoolExecutor) -> Iterator[ProcessPoolExecutor]:
    """`pool` until the block ends: then shut down, its queued units cancelled where the block raised."""
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()
