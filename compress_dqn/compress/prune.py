"""Magnitude pruning with tfmot, driven by hand inside our own loop.

Our training loops dispatch their events to tf_keras callbacks as fit() does, so tfmot's own
UpdatePruningStep plugs in. It has no batch hooks (each wrapper counts its own steps in its
training call), so a phase of K gradient steps stays one fused call. Sparse Dense layers get no
speed-up in TFLite/XNNPACK: pruning pays off in the gzipped (or EXPERIMENTAL_SPARSITY) file size.
"""

from __future__ import annotations

import numpy as np
import tensorflow_model_optimization as tfmot
from tensorflow_model_optimization.python.core.sparsity.keras import pruning_wrapper

from compress_dqn._tf import tf_keras
from compress_dqn.errors import UserError
from compress_dqn.rl.networks import WEIGHT_LAYERS, independent_copy, weight_layers
from compress_dqn.recipe.schema import PruneConfig

_sparsity = tfmot.sparsity.keras


def check_layer_names(model: tf_keras.Model, names: list[str], key: str) -> None:
    known = [layer.name for layer in weight_layers(model)]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserError(f"{key}: no Dense or Conv2D layer named {', '.join(unknown)}; layers are {', '.join(known)}")


def _ramp(cfg: PruneConfig, total_steps: int) -> tuple[int, int, int]:
    """(begin, end, frequency) of the pruning over a fine-tune of total_steps gradient steps."""
    begin = int(cfg.begin_fraction * total_steps)
    if cfg.schedule == "constant":
        return begin, begin, cfg.frequency
    span = max(1, int(cfg.end_fraction * total_steps) - begin)
    # tfmot only prunes on steps begin + n * frequency: end on one, or a short fine-tune (fewer steps
    # than the frequency) would never reach the target sparsity.
    frequency = min(cfg.frequency, span)
    return begin, begin + (span // frequency) * frequency, frequency


def schedule(cfg: PruneConfig, total_steps: int) -> _sparsity.PruningSchedule:
    """The tfmot schedule over a fine-tune of total_steps gradient steps."""
    begin, end, frequency = _ramp(cfg, total_steps)
    if cfg.schedule == "constant":
        return _sparsity.ConstantSparsity(cfg.sparsity, begin_step=begin, frequency=frequency)
    return _sparsity.PolynomialDecay(0.0, cfg.sparsity, begin_step=begin, end_step=end, frequency=frequency)


def pruned_from_step(cfg: PruneConfig, total_steps: int) -> int:
    """The gradient step count from which every pruned layer is at its target sparsity: a snapshot
    kept by selection (fine_tune.select_interval) must come from then on, or the fine-tune could
    hand back a less pruned model than the recipe asks for. The wrapper's mask update for step
    `end` runs in the end-th training call (tfmot 0.8.1), so the end-th step's weights are already
    at the target; one step more is a margin (the LunarLander sweep's figures were measured with it)."""
    return _ramp(cfg, total_steps)[1] + 1


def prune_model(model: tf_keras.Model, cfg: PruneConfig, total_steps: int) -> tf_keras.Model:
    """A pruning-wrapped copy: every Dense and Conv2D layer not in cfg.exclude gets prune_low_magnitude."""
    check_layer_names(model, cfg.exclude, "prune.exclude")
    plan = schedule(cfg, total_steps)

    def wrap(layer: tf_keras.layers.Layer) -> tf_keras.layers.Layer:
        if isinstance(layer, WEIGHT_LAYERS) and layer.name not in cfg.exclude:
            return _sparsity.prune_low_magnitude(layer, pruning_schedule=plan)
        return layer

    return tf_keras.models.clone_model(independent_copy(model), clone_function=wrap)


def update_pruning_step() -> tf_keras.callbacks.Callback:
    """The callback a pruning fine-tune needs: tfmot's UpdatePruningStep (it starts the wrappers'
    step counters and applies the final masks at the epoch's end, as under fit())."""
    return _sparsity.UpdatePruningStep()


def strip(model: tf_keras.Model) -> tf_keras.Model:
    """Remove the pruning wrappers: plain layers holding the masked weights.

    The masks are applied first. tfmot's strip_pruning keeps the kernels as they are, and a
    gradient step after the last mask multiply (or weights a selection restored) leaves small
    values where the mask is zero."""
    for layer in model.submodules:
        if isinstance(layer, pruning_wrapper.PruneLowMagnitude):
            layer.pruning_obj.weight_mask_op()
    return _sparsity.strip_pruning(model)


def kernel_sparsity(model: tf_keras.Model) -> dict[str, float]:
    """Share of exact zeros in each Dense/Conv2D kernel of a plain (stripped) model."""
    return {
        layer.name: float(1.0 - np.count_nonzero(layer.kernel.numpy()) / layer.kernel.numpy().size)
        for layer in weight_layers(model)
    }
