"""Build one compressed variant from the trained baseline, in a fixed order:

    start network (copy of the baseline, or a fresh student)
    -> wrap (prune_low_magnitude / cluster_weights)
    -> recovery fine-tune (distill on replay states, or TD in the environment)
    -> strip the wrappers
    -> quantization-aware training (PQAT/CQAT when the model is pruned/clustered)
    -> TFLite converter settings (post-training quantization, sparse format)

The result is handed to export and evaluation like the baseline. The one file written here is a
pruned model that other variants of the run can start from (`shared`, see _pruned_and_recovered).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from compress_dqn._tf import set_seed, tf, tf_keras
from compress_dqn.compress import cluster, prune, quantize
from compress_dqn.compress.details import BuildDetails, FineTune, InputNormalization
from compress_dqn.compress.distill import build_student
from compress_dqn.compress.recovery import (cluster_fine_tune, fine_tune, fine_tune_gradient_steps, fine_tune_seed,
                                            qat_fine_tune)
from compress_dqn.compress.structured import check_shrinkable, shrink_from_teacher
from compress_dqn.compress.rewrites import (
    equalize_head_input,
    flattened_dense_as_conv,
    input_range,
    input_statistics,
    normalize_model_input,
    split_value_advantage,
    with_action_head,
)
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError
from compress_dqn.fileio import load_dict, save_arrays
from compress_dqn.recipe.schema import QatTeacher, QuantizeConfig, Recipe, VariantConfig
from compress_dqn.replay.buffer import ReplayBuffer, sampling_undone
from compress_dqn.rl.networks import WEIGHT_LAYERS, count_params, independent_copy


@dataclass
class BuiltVariant:
    """A variant ready for export: the model to serve and how to convert it."""

    export_model: tf_keras.Model
    params: int
    nonzero_params: int
    quantize: QuantizeConfig | None
    calibration: np.ndarray | None
    try_sparse_format: bool
    details: BuildDetails = field(default_factory=BuildDetails)
    input_normalization: Normalization | None = None
    """tflite_model() takes (obs - mean) / std (rewrites.normalize_model_input); the
    exported file computes it itself in front of its input (deploy.tflite.graph_input)."""
    normalized_model: tf_keras.Model | None = None
    """The model on normalized observations where it was trained as such (QAT); export_model is it
    behind a fixed normalization layer."""

    @property
    def converts_own_model(self) -> bool:
        """Whether the TFLite file is converted from tflite_model() rather than export_model."""
        return self.input_normalization is not None or bool(self.quantize and self.quantize.action_head)

    @property
    def weight_only(self) -> bool:
        """Whether the file's kernels are stored in int8 after a float conversion (quantize.mode weight_only)."""
        return self.quantize is not None and self.quantize.mode == "weight_only"

    def tflite_model(self) -> tf_keras.Model:
        """The model the TFLite file is converted from: normalization folded in where there is one."""
        if self.normalized_model is not None:
            return self.normalized_model
        model = self.export_model
        if self.input_normalization is not None:
            model = normalize_model_input(model, self.input_normalization)
        if self.quantize is not None and self.quantize.action_head:
            model = with_action_head(model, self.calibration)  # calibration: what the folded model takes
        return model

    def converter(self, sparse: bool = False) -> Callable[[tf.lite.TFLiteConverter], None]:
        """TFLite converter settings for this variant, optionally with the sparse weight format."""
        return quantize.converter_setup(self.quantize, self.calibration, sparse=sparse)


def dense_kernels(model: tf_keras.Model) -> dict[str, np.ndarray]:
    """Each Dense/Conv2D kernel by layer name, looking through tfmot wrappers (QAT keeps float kernels)."""
    kernels = {}
    for layer in model.layers:
        if isinstance(layer, tf_keras.Model):  # a QAT model behind its input normalization
            kernels.update(dense_kernels(layer))
            continue
        inner = getattr(layer, "layer", layer)
        if isinstance(inner, WEIGHT_LAYERS):
            # A QAT wrapper swaps inner.kernel for a fake-quant tensor; the variable is in its weights.
            (kernel,) = [w for w in layer.weights if w.name.endswith("kernel:0") and "cluster" not in w.name]
            kernels[inner.name] = kernel.numpy()
    return kernels


SHARED_PRUNING_FORMAT = 1
"""Part of every pruning_key: raise it when what a shared pruning computes changes, so that a run
resumed with newer code does not load pruned models the older code made."""


def pruning_key(variant: VariantConfig, recipe: Recipe, baseline: tf_keras.Model) -> str:
    """What a variant's pruned and recovered baseline depends on, hashed: the pruning, its
    fine-tune, the recipe's seed, task and training, and the baseline's weights."""
    prune = variant.prune.model_dump(mode="json", exclude={"sparse_format"})  # an export setting
    depends = {"format": SHARED_PRUNING_FORMAT, "prune": prune,
               "fine_tune": variant.fine_tune.model_dump(mode="json"), "seed": recipe.seed,
               "env": recipe.env.model_dump(mode="json"), "train": recipe.train.model_dump(mode="json")}
    digest = hashlib.sha256(json.dumps(depends, sort_keys=True).encode())
    for weights in baseline.get_weights():
        digest.update(np.ascontiguousarray(weights).tobytes())
    return digest.hexdigest()[:16]


def _pruned_and_recovered(variant: VariantConfig, model: tf_keras.Model, recipe: Recipe, baseline: tf_keras.Model,
                          replay: ReplayBuffer, details: BuildDetails, quiet: bool, shared: Path | None
                          ) -> tf_keras.Model:
    """Prune, recover with the fine-tune and strip; or, where `shared` holds an equal pruning of
    the baseline (pruning_key), load it.

    Why: variants often share their pruning (the demo's prune-90-int8 and pqat-90-int8 both prune
    to 90% with the same 6,000-step fine-tune), and the pruning
    fine-tune is most of their build. A shared pruning's fine-tune is seeded by the key, not the
    variant's name; the builder that computes it loads it back from the file as every later one
    does; and the replay draws and random state the stages after it see are the same either way.
    So a variant's bytes do not depend on which variant pruned first (or on a parallel build).
    Not shared: a pruned student (it starts from its own weights) and a TD fine-tune (it adds
    transitions to the replay buffer that the later stages sample).
    """
    ft = variant.fine_tune

    def prune_and_recover(seed_label: str | None = None) -> tf_keras.Model:
        steps = fine_tune_gradient_steps(ft, recipe)
        wrapped = prune.prune_model(model, variant.prune, steps)
        details.fine_tune = fine_tune(wrapped, ft, recipe, baseline, replay, (prune.update_pruning_step(),),
                                      wrapped=True, label=variant.name, quiet=quiet, seed_label=seed_label,
                                      select_from=prune.pruned_from_step(variant.prune, steps))
        return prune.strip(wrapped)

    if shared is None or variant.student or ft.method != "distill":
        return prune_and_recover()
    name = f"prune-{pruning_key(variant, recipe, baseline)}"
    path = shared / f"{name}.npz"
    if not path.exists():  # two builders may both compute it: each writes the same file atomically
        set_seed(fine_tune_seed(recipe.seed, name))
        with sampling_undone(replay):
            weights = prune_and_recover(seed_label=name).get_weights()
        save_arrays(path, {"fine_tune": np.array(json.dumps(details.fine_tune.to_dict())),
                           **{f"w{i:04d}": w for i, w in enumerate(weights)}})
    stored = load_dict(path)
    details.fine_tune = FineTune(**json.loads(str(stored.pop("fine_tune")[()])), shared=name)
    fresh = independent_copy(baseline)
    fresh.set_weights([stored[k] for k in sorted(stored)])
    # The stages after it start from the same random state whether the pruning ran here or was loaded.
    set_seed(fine_tune_seed(recipe.seed, f"{variant.name}/pruned"))
    return fresh


def _compress_and_recover(variant: VariantConfig, model: tf_keras.Model, recipe: Recipe, baseline: tf_keras.Model,
                          replay: ReplayBuffer, details: BuildDetails, quiet: bool, shared: Path | None = None
                          ) -> tf_keras.Model:
    """Wrap (prune/cluster), recover with the fine-tune, strip; or distill a student."""
    ft, label = variant.fine_tune, variant.name
    if variant.prune:
        return _pruned_and_recovered(variant, model, recipe, baseline, replay, details, quiet, shared)
    if variant.student:
        details.fine_tune = fine_tune(model, ft, recipe, baseline, replay, label=label, quiet=quiet)
    if not variant.cluster:
        return model
    # A distilled student clusters from its float weights, as a baseline's copy does.
    wrapped = cluster.cluster_model(model, variant.cluster)
    if variant.student:
        details.cluster_fine_tune = fine_tune(wrapped, cluster_fine_tune(variant), recipe, baseline, replay,
                                              wrapped=True, label=f"{label}/cluster", quiet=quiet)
    else:
        details.fine_tune = fine_tune(wrapped, ft, recipe, baseline, replay, wrapped=True, label=label, quiet=quiet)
    return cluster.strip(wrapped)


def _quantization_aware(variant: VariantConfig, model: tf_keras.Model, recipe: Recipe, baseline: tf_keras.Model,
                        replay: ReplayBuffer, info: EnvInfo, details: BuildDetails, quiet: bool
                        ) -> tuple[tf_keras.Model, tf_keras.Model, Normalization | None]:
    """QAT (PQAT/CQAT where the model is pruned/clustered): (the fake-quantized model on raw
    observations, the same on normalized ones or None, the normalization or None).

    Where the recipe normalizes the input, QAT gives each feature its own range as post-training
    int8 does: it trains the normalized model (made by rewrites.normalize_model_input) behind
    a fixed normalization layer, so the fine-tune still sees raw observations. On the CartPole
    demo's baseline, qat-int8, pqat-90-int8 and the 32x32 student each kept 500.0 with it and lost
    20-33 points without it (one build each).
    """
    q = variant.quantize
    preserve = None
    if q.preserve and variant.prune:
        preserve = "sparsity"
    elif q.preserve and variant.cluster:
        preserve = "clusters"
    observations = replay.sample_observations(q.calibration_samples)
    normalization = _input_normalization(q, info, observations, details)
    if q.equalize:
        model = equalize_head_input(model, observations)
    plain, seen = model, observations
    if normalization is not None:
        plain = normalize_model_input(model, normalization)
        seen = normalization.apply(observations)
    # The float model on raw observations, copied before QAT wraps its layers and trains: what
    # qat_teacher "float" distils to, held fixed.
    teacher = baseline if q.qat_teacher == "baseline" else independent_copy(model)
    if q.per_channel_dense:
        plain = flattened_dense_as_conv(plain)
    qat = quantize.qat_model(plain, preserve, quantize.FLOAT_HEADS if q.float_head else (), q.kernel_bits)
    quantize.calibrate_ranges(qat, plain, seen)
    trained = qat if normalization is None else quantize.behind_normalization(qat, normalization)
    details.qat = fine_tune(trained, qat_fine_tune(variant), recipe, teacher, replay, wrapped=True,
                            label=f"{variant.name}/qat", quiet=quiet)
    details.qat.preserve = preserve
    if preserve == "sparsity":
        details.sparsity_after_qat = {
            name: float(1.0 - np.count_nonzero(k) / k.size)
            for name, k in dense_kernels(qat).items()
            if name in details.sparsity
        }
    return trained, (qat if normalization is not None else None), normalization


def _input_normalization(q: QuantizeConfig, info: EnvInfo, observations: np.ndarray, details: BuildDetails
                         ) -> Normalization | None:
    """Per-feature normalization of replay observations where the recipe asks to normalize the input
    of an integer model (flat float observations only), else None."""
    if not (q.normalize_input and len(info.obs_shape) == 1 and info.input_scale is None):
        return None
    normalization = input_range(observations) if q.input_scaling == "range" else input_statistics(observations)
    # (obs - mean) / std; with input_scaling: range, mean is the midrange and std the half-range.
    details.input_normalization = InputNormalization(mean=normalization.mean.tolist(), std=normalization.std.tolist(),
                                                     scaling=q.input_scaling)
    return normalization


def _calibration(q: QuantizeConfig | None, replay: ReplayBuffer, info: EnvInfo, details: BuildDetails
                 ) -> tuple[np.ndarray | None, Normalization | None]:
    """Post-training integer quantization's representative observations, normalized per feature
    where the recipe asks for it (flat float observations only)."""
    if q is None or q.mode not in ("int8", "int16x8"):
        return None, None
    calibration = replay.sample_observations(q.calibration_samples)
    normalization = _input_normalization(q, info, calibration, details)
    if normalization is None:
        return calibration, None
    return normalization.apply(calibration), normalization


def build_variant(
    variant: VariantConfig,
    baseline: tf_keras.Model,
    replay: ReplayBuffer,
    recipe: Recipe,
    info: EnvInfo,
    quiet: bool = False,
    shared: Path | None = None,
) -> BuiltVariant:
    """Apply the variant's techniques to (a copy of) the baseline. shared: a folder where pruned
    models are kept for the run's other variants (see _pruned_and_recovered); None: keep none."""
    details = BuildDetails()
    model = _recovered(variant, baseline, replay, recipe, info, details, quiet, shared)
    return _finished(variant, model, baseline, replay, recipe, info, details, quiet)


def build_variant_per_teacher(
    variant: VariantConfig,
    teachers: Sequence[QatTeacher],
    baseline: tf_keras.Model,
    replay: ReplayBuffer,
    recipe: Recipe,
    info: EnvInfo,
    quiet: bool = False,
) -> list[BuiltVariant]:
    """A QAT variant built once up to its float model (a student's distillation, most of the
    cost), then QAT'd once per teacher (quantize.qat_teacher) from that model: one build each.

    Each QAT starts from the same random state and replay draws, seeded by the variant's name and
    its teacher, so a teacher's build does not depend on which teachers came before it."""
    details = BuildDetails()
    model = _recovered(variant, baseline, replay, recipe, info, details, quiet, shared=None)
    built = []
    for teacher in teachers:
        set_seed(fine_tune_seed(recipe.seed, f"{variant.name}/qat-{teacher}"))
        own = variant.model_copy(update={"quantize": variant.quantize.model_copy(update={"qat_teacher": teacher})})
        with sampling_undone(replay):
            built.append(_finished(own, independent_copy(model), baseline, replay, recipe, info,
                                   details.model_copy(deep=True), quiet))
    return built


def _recovered(variant: VariantConfig, baseline: tf_keras.Model, replay: ReplayBuffer, recipe: Recipe, info: EnvInfo,
               details: BuildDetails, quiet: bool, shared: Path | None) -> tf_keras.Model:
    """The variant's float model: a student distilled, or the baseline's copy pruned or clustered
    and recovered, its output layer split into value and advantage heads."""
    model = build_student(info, variant.student) if variant.student else independent_copy(baseline)
    if variant.student and variant.student.from_teacher:
        _start_from_teacher(variant, model, baseline, replay)
    model = _compress_and_recover(variant, model, recipe, baseline, replay, details, quiet, shared)
    # Exact reparameterisation of the output layer into advantage + value heads: quantized
    # variants keep the action gaps (see rewrites.split_value_advantage). What is measured below
    # is what is exported: the split heads, not the layer they replace.
    return split_value_advantage(model)


SHRINK_STATES = 2048
"""Replay states the units of a student started from the teacher are ranked on."""


def _start_from_teacher(variant: VariantConfig, student: tf_keras.Model, baseline: tf_keras.Model,
                        replay: ReplayBuffer) -> None:
    """The student's weights become the baseline's best-ranked filters and units (structured pruning)."""
    try:
        check_shrinkable(baseline, student)
    except ValueError as exc:
        raise UserError(f"variant {variant.name}: student.from_teacher: {exc}; give the baseline's layers, "
                        "each as narrow or narrower, or remove from_teacher") from None
    with sampling_undone(replay):
        states = replay.sample_observations(SHRINK_STATES)
    shrink_from_teacher(baseline, student, states, variant.student.from_teacher)


def _finished(variant: VariantConfig, model: tf_keras.Model, baseline: tf_keras.Model, replay: ReplayBuffer,
              recipe: Recipe, info: EnvInfo, details: BuildDetails, quiet: bool) -> BuiltVariant:
    """The float model quantized as the variant asks (QAT here, post-training int8 at conversion)."""
    if variant.prune:
        details.sparsity = prune.kernel_sparsity(model)
    elif variant.cluster:
        details.unique_kernel_values = cluster.unique_kernel_values(model)
    params, _ = count_params(model)
    q = variant.quantize
    export_model, normalized_model = model, None
    if q is not None and q.mode == "qat":
        export_model, normalized_model, normalization = _quantization_aware(
            variant, model, recipe, baseline, replay, info, details, quiet)
        calibration = None
    else:
        calibration, normalization = _calibration(q, replay, info, details)
    kernels = dense_kernels(export_model)
    nonzero = int(sum(np.count_nonzero(k) for k in kernels.values())) + params - sum(k.size for k in kernels.values())
    return BuiltVariant(
        export_model=export_model,
        params=params,
        nonzero_params=nonzero,
        quantize=q,
        calibration=calibration,
        try_sparse_format=bool(variant.prune and variant.prune.sparse_format),
        details=details,
        input_normalization=normalization,
        normalized_model=normalized_model,
    )
