"""Recovery after compression: the fine-tune (distillation to the baseline, or more TD learning), its seed, and a
variant's build cost in gradient steps (a parallel build starts the costliest first)."""

from __future__ import annotations

import zlib

import numpy as np

from compress_dqn._tf import tf_keras, use_xla
from compress_dqn.compress.details import FineTune
from compress_dqn.compress.distill import Distiller
from compress_dqn.recipe.schema import FineTuneConfig, Recipe, VariantConfig
from compress_dqn.replay.buffer import ReplayBuffer
from compress_dqn.rl.callbacks import KeepBestPolicy
from compress_dqn.rl.trainer import DQNTrainer


def fine_tune_gradient_steps(ft: FineTuneConfig, recipe: Recipe) -> int:
    """Gradient steps a fine-tune will take (the pruning schedule is laid out over them)."""
    if ft.method == "distill":
        return ft.steps
    phases = ft.steps // recipe.train.train_freq
    return max(1, phases * recipe.train.gradient_steps)


def _own_tuning(ft: FineTuneConfig, steps: int | None, learning_rate: float | None) -> FineTuneConfig:
    """`ft` with a later phase's own steps and step size where the recipe gives them."""
    return ft.model_copy(update={"steps": steps or ft.steps, "learning_rate": learning_rate or ft.learning_rate})


def qat_fine_tune(variant: VariantConfig) -> FineTuneConfig:
    """The QAT fine-tune of a variant with quantize.mode qat."""
    return _own_tuning(variant.fine_tune, variant.quantize.qat_steps, variant.quantize.qat_learning_rate)


def cluster_fine_tune(variant: VariantConfig) -> FineTuneConfig:
    """A clustered student's fine-tune after its distillation."""
    return _own_tuning(variant.fine_tune, variant.cluster.steps, variant.cluster.learning_rate)


# What one gradient step of each kind costs, relative to a pruning step: clustering's wrapper finds
# every weight's centroid at each step. The timings behind these ratios: docs/executors.md.
STEP_COST = {"distill": 1.0, "prune": 1.0, "cluster": 2.2, "qat": 1.2, "pqat": 2.1, "cqat": 2.2}


def build_cost(variant: VariantConfig, recipe: Recipe) -> float:
    """A variant's build cost in pruning-step units (its fine-tune, then QAT): a parallel build
    starts the costliest first, so that a long build does not start last and leave the other
    workers idle (docs/executors.md)."""
    q = variant.quantize
    cost = 0.0
    if variant.student and variant.cluster:  # distilled in float, then clustered
        cost += STEP_COST["distill"] * fine_tune_gradient_steps(variant.fine_tune, recipe)
        cost += STEP_COST["cluster"] * fine_tune_gradient_steps(cluster_fine_tune(variant), recipe)
    elif variant.prune or variant.cluster or variant.student:
        kind = "prune" if variant.prune else "cluster" if variant.cluster else "distill"
        cost += STEP_COST[kind] * fine_tune_gradient_steps(variant.fine_tune, recipe)
    if q is not None and q.mode == "qat":
        kind = ("pqat" if variant.prune else "cqat" if variant.cluster else "qat") if q.preserve else "qat"
        teachers = variant.candidates.qat_teachers if variant.candidates else None
        cost += STEP_COST[kind] * fine_tune_gradient_steps(qat_fine_tune(variant), recipe) * len(teachers or [1])
    return cost * (variant.candidates.count if variant.candidates else 1)  # each candidate is a build


def fine_tune(
    model: tf_keras.Model,
    ft: FineTuneConfig,
    recipe: Recipe,
    baseline: tf_keras.Model,
    replay: ReplayBuffer,
    callbacks: tuple = (),
    wrapped: bool = False,
    label: str = "fine-tune",
    quiet: bool = False,
    seed_label: str | None = None,
    select_from: int = 0,
) -> FineTune:
    """Recover return after compression: distillation to the baseline, or more TD learning.
    wrapped: the model carries tfmot's wrappers (pruning, clustering, QAT: trained without XLA);
    label names the progress; seed_label (default: label) seeds the fine-tune's environment;
    select_from: the first gradient step whose weights a selection may keep."""
    # tfmot's wrappers stay out of XLA. QAT's fake-quant ones compile and run 7x faster a step,
    # but XLA rounds the quantizer's range ends its own way: a kernel's largest weight, which sets
    # the range, lost its straight-through gradient, and DQN MountainCar's QAT 32x32 students
    # compiled averaged -17 against -6 (6 builds each, 200 paired episodes; docs/zoo-search.md).
    convolutional = any(isinstance(layer, tf_keras.layers.Conv2D) for layer in model.submodules)
    jit = use_xla(recipe.train.jit_compile, convolutional) and not wrapped
    selection = None
    if ft.select_interval:
        seeds = range(recipe.train.eval_seed, recipe.train.eval_seed + ft.select_episodes)
        selection = KeepBestPolicy(recipe.env, seeds, ft.select_interval, first_step=select_from)
        callbacks = (*callbacks, selection)
    done = _fine_tune(model, ft, recipe, baseline, replay, callbacks, jit, label, quiet, seed_label or label)
    if selection is not None:
        done.selection = selection.summary()
    return done


def _fine_tune(model: tf_keras.Model, ft: FineTuneConfig, recipe: Recipe, baseline: tf_keras.Model,
               replay: ReplayBuffer, callbacks: tuple, jit: bool, label: str, quiet: bool, seed_label: str
               ) -> FineTune:
    if ft.method == "distill":
        loss = Distiller(
            model, baseline, replay, ft, callbacks=callbacks, max_grad_norm=recipe.train.max_grad_norm,
            jit_compile=jit, label=label, quiet=quiet, env=recipe.env, seed=fine_tune_seed(recipe.seed, seed_label),
        ).run()
        return FineTune(method="distill", gradient_steps=ft.steps, final_loss=loss)

    cfg = recipe.train.model_copy(update={
        "total_timesteps": ft.steps,
        "learning_starts": 0,
        "exploration_initial_eps": recipe.train.exploration_final_eps,
        "exploration_fraction": 0.0,
        "learning_rate": ft.learning_rate,
        "learning_rate_schedule": ft.learning_rate_schedule,
        "eval_interval": 0,
        "jit_compile": jit,
    })
    result = DQNTrainer.from_recipe(
        cfg, recipe.env, recipe.replay, seed=fine_tune_seed(recipe.seed, seed_label), callbacks=callbacks, label=label, quiet=quiet,
        initial_model=model, initial_replay=replay, frozen_target=baseline.get_weights(), device=recipe.device,
        target_template=baseline,
    ).train()
    return FineTune(method="td", env_steps=result.env_steps, gradient_steps=result.gradient_steps)


def fine_tune_seed(seed: int, label: str) -> int:
    """A TD fine-tune's seed (environment, exploration, replay sampling): derived from the training
    seed and the variant, so no fine-tune replays another training seed's episodes."""
    return int(np.random.SeedSequence([seed, zlib.crc32(label.encode())]).generate_state(1)[0] % 2**31)
