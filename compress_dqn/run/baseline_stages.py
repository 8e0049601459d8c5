"""The baseline's stages: train (or load a brought network), export, evaluate, random policy, held-out states."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from compress_dqn._tf import tf
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.envs.episodes import random_returns, run_episodes
from compress_dqn.evaluation.measure import measure_size
from compress_dqn.evaluation.play import evaluate
from compress_dqn.evaluation.results import BaselineSource, TrainFigures
from compress_dqn.evaluation.verdicts import summarize
from compress_dqn.convert.conversion import convert_policy
from compress_dqn.fileio import refused_writes, save_arrays
from compress_dqn.port.baseline import file_digest, load_model, load_transitions, rollout
from compress_dqn.port.check import check_port
from compress_dqn.port.run_dir import run_replay
from compress_dqn.recipe.schema import EnvConfig, Recipe
from compress_dqn.replay.sizing import replay_capacity
from compress_dqn.rl.networks import count_params
from compress_dqn.rl.trainer import DQNTrainer
from compress_dqn.run.context import RunContext, Stage, run_stages
from compress_dqn.store.layout import BASELINE, RunLayout
from compress_dqn.store.records import Artifacts, EvaluateRecord, ExportRecord, HeldoutRecord, RandomRecord


def _train_stage(ctx: RunContext) -> TrainFigures:
    """Train the baseline (resuming from baseline/checkpoints), or load the user's network."""
    if ctx.recipe.baseline is not None:
        return _load_baseline(ctx.recipe, ctx.info, ctx.layout, ctx.log)
    recipe = ctx.recipe
    trainer = DQNTrainer.from_recipe(
        recipe.train, recipe.env, recipe.replay, seed=recipe.seed,
        ckpt_dir=ctx.layout.checkpoints, tb_dir=ctx.layout.tensorboard(BASELINE),
        label=BASELINE, quiet=ctx.quiet, device=recipe.device,
    )
    result = trainer.train()
    ctx.layout.baseline.mkdir(parents=True, exist_ok=True)
    save_arrays(ctx.layout.weights, result.model.get_weights())
    save_arrays(ctx.layout.replay, result.replay.state_dict())
    ctx.log(f"[baseline] trained {result.env_steps} steps in {result.wall_seconds:.1f} s "
            f"({result.env_steps_per_second:.0f} steps/s)")
    return TrainFigures(
        env_steps=result.env_steps, gradient_steps=result.gradient_steps, episodes=result.episodes,
        wall_seconds=round(result.wall_seconds, 3), env_steps_per_second=round(result.env_steps_per_second, 1),
        resumed_from_step=result.resumed_from, selected_step=result.selected_step,
        selected_eval_return=result.selected_return, replay_capacity=result.replay.capacity,
        replay_nbytes=result.replay.nbytes, device=ctx.device, dtype_policy=trainer.dtype_policy,
    )


def _export_stage(ctx: RunContext) -> ExportRecord:
    """A slim SavedModel and an fp32 TFLite file of the baseline."""
    files = ctx.layout.policy(BASELINE)
    convert_policy(ctx.model, ctx.info, files.folder)
    params, nonzero = count_params(ctx.model)
    size = measure_size(params, nonzero, files.tflite, files.saved_model)
    ctx.log(f"[baseline] exported: TFLite {size.tflite_bytes} bytes ({size.tflite_gzip_bytes} gzipped)")
    return ExportRecord(artifacts=Artifacts(**ctx.layout.artifacts(BASELINE)), size=size)


def _evaluate_stage(ctx: RunContext) -> EvaluateRecord:
    """The deployed artifact (TFLite) on the fixed episode seeds."""
    seeds = ctx.ranges.first
    stats = evaluate(TFLitePolicy(ctx.layout.policy(BASELINE).tflite), ctx.recipe.env, len(seeds), seeds.start)
    ctx.log(f"[baseline] return {stats.mean:.1f} ± {stats.std:.1f} over {len(seeds)} episodes "
            f"(95% CI {stats.ci95[0]:.1f}..{stats.ci95[1]:.1f})")
    return EvaluateRecord(returns=stats, action_agreement=1.0)


def _random_stage(ctx: RunContext) -> RandomRecord:
    """A uniform-random policy on the same episode seeds: the floor of normalized scores."""
    stats = summarize(random_returns(ctx.recipe.env, ctx.ranges.first, ctx.info.n_actions))
    ctx.log(f"[random] return {stats.mean:.1f} ± {stats.std:.1f} (uniform-random actions, same episodes)")
    return RandomRecord(returns=stats)


def _heldout_stage(ctx: RunContext) -> HeldoutRecord:
    """States from episodes (heldout_seed..) that no calibration, fine-tune or evaluation plays."""
    seeds = ctx.ranges.heldout
    states = heldout_states(ctx.layout.policy(BASELINE).tflite, ctx.recipe.env, seeds)
    save_arrays(ctx.layout.heldout, {"observations": states})
    return HeldoutRecord(episodes=len(seeds), seed=seeds.start)


BASELINE_STAGES = [Stage("train", _train_stage), Stage("export", _export_stage), Stage("evaluate", _evaluate_stage),
                   Stage("random", _random_stage), Stage("heldout", _heldout_stage)]


def train_baseline(ctx: RunContext) -> None:
    """The baseline stages: train (or load), export, evaluate, random policy, held-out states."""
    run_stages(ctx, BASELINE_STAGES)
    shutil.rmtree(ctx.layout.checkpoints, ignore_errors=True)


def _load_baseline(recipe: Recipe, info: EnvInfo, layout: RunLayout, log: Callable[[str], None]) -> TrainFigures:
    """The train stage for a brought baseline: load and check it, then collect its data."""
    source = recipe.baseline
    model = load_model(source.from_, info)
    layout.baseline.mkdir(parents=True, exist_ok=True)
    tmp = layout.baseline / f".tmp-model-{os.getpid()}.keras"  # tf_keras wants the suffix
    try:
        with refused_writes(layout.keras_model, also=(tf.errors.OpError,)):
            model.save(str(tmp))
            os.replace(tmp, layout.keras_model)
    finally:
        tmp.unlink(missing_ok=True)
    save_arrays(layout.weights, model.get_weights())
    capacity = replay_capacity(recipe.train, recipe.replay, info)
    other = RunLayout.find(source.from_)
    if source.transitions is not None:
        replay, data = load_transitions(source.transitions, info, capacity, recipe.seed)
    elif other is not None:  # another run's baseline: the replay it trained on
        replay, data = run_replay(other.root, info)
    else:
        replay, data = rollout(model, recipe.env, info, source.rollout.steps, source.rollout.epsilon, capacity, recipe.seed)
    save_arrays(layout.replay, replay.state_dict())
    log(f"[baseline] loaded {source.from_}; data: {data.kind} ({replay.num_transitions} transitions)")
    return TrainFigures(
        source=BaselineSource(from_=str(source.from_), data=data,
                             sha256=file_digest(other.weights if other else source.from_)),
        port_check=check_port(source.from_, model, replay, info),
        replay_capacity=replay.capacity, replay_nbytes=replay.nbytes,
    )


def heldout_states(tflite: Path, env: EnvConfig, seeds: range, limit: int = 5000) -> np.ndarray:
    """States the baseline visits greedily on the held-out episode seeds (at most `limit`, evenly
    subsampled with a fixed seed): where variants' actions are compared with the baseline's."""
    policy = TFLitePolicy(tflite)
    visited: list[np.ndarray] = []

    def act(obs: np.ndarray) -> int:
        visited.append(np.array(obs))
        return policy.act(obs)

    run_episodes(act, env, seeds)
    pick = np.random.default_rng(seeds.start).choice(len(visited), size=min(len(visited), limit), replace=False)
    return np.stack([visited[i] for i in sorted(pick)])
