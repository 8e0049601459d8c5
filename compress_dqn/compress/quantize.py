"""Quantization: post-training (at TFLite conversion) and quantization-aware training (tfmot).

Full-integer modes calibrate on observations drawn from the replay buffer: the states the agent
actually visits, not random noise. QAT on a pruned or clustered model uses tfmot's collaborative
schemes (PQAT / CQAT) so the sparsity or the clusters survive the QAT fine-tune.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import numpy as np
import tensorflow_model_optimization as tfmot

from compress_dqn._tf import tf, tf_keras
from compress_dqn.compress import low_bit
from compress_dqn.compress.rewrites import SPLIT_HEADS
from compress_dqn.envs.normalization import Normalization
from compress_dqn.rl.networks import independent_copy, weight_layers
from compress_dqn.recipe.schema import QuantizeConfig

Preserve = Literal["sparsity", "clusters"] | None


FLOAT_HEADS = SPLIT_HEADS
"""The split output heads (compress.rewrites.split_value_advantage) that QAT's float_head leaves in float."""


def qat_model(model: tf_keras.Model, preserve: Preserve = None, float_layers: tuple[str, ...] = (),
              kernel_bits: dict[str, int] | None = None) -> tf_keras.Model:
    """A copy of a plain model with fake-quant wrappers for quantization-aware training.

    An image network's input Rescaling (uint8 -> float) has no QAT config. Left in the quantized
    model unannotated, it keeps tfmot from quantizing what follows it: the first conv then trains
    and converts in float. So the layers after it are quantized as a model of their own, whose
    input quantizer sees the rescaled frame, and the Rescaling stays in front in float.
    Layers named in float_layers are not annotated: they train and convert in float. Layers named
    in kernel_bits train their kernel at that many bits (quantize.kernel_bits)."""
    copy = independent_copy(model)
    kernel_bits = kernel_bits or {}
    _check_layer_choices(copy, preserve, float_layers, kernel_bits)
    front = _input_rescaling(copy)
    if front is None:
        return _quantize_applied(copy, preserve, float_layers, kernel_bits)
    body = _layers_after(copy, front)
    inputs = tf_keras.Input(copy.input_shape[1:], dtype=copy.inputs[0].dtype, name="obs")
    scaled = tf_keras.layers.Rescaling(front.scale, front.offset, name=front.name)(inputs)
    return tf_keras.Model(inputs, _quantize_applied(body, preserve, float_layers, kernel_bits)(scaled), name=copy.name)


def _check_layer_choices(model: tf_keras.Model, preserve: Preserve, float_layers: tuple[str, ...],
                         kernel_bits: dict[str, int]) -> None:
    """ValueError, naming the model's weight layers, where float_layers or kernel_bits name none of
    them, where one layer is in both, or where kernel_bits meets a preserving scheme (which has none)."""
    names = sorted(layer.name for layer in weight_layers(model))
    for what, wanted in (("to keep in float", set(float_layers)), ("for kernel_bits", set(kernel_bits))):
        if wanted - set(names):
            raise ValueError(f"no layer named {', '.join(sorted(wanted - set(names)))} {what}; "
                             f"the weight layers are {', '.join(names)}")
    if set(float_layers) & set(kernel_bits):
        raise ValueError(f"{', '.join(sorted(set(float_layers) & set(kernel_bits)))} stays in float: remove it from kernel_bits")
    if kernel_bits and preserve is not None:
        raise ValueError(f"kernel_bits has no {preserve}-preserving QAT; drop kernel_bits or quantize.preserve")


def _input_rescaling(model: tf_keras.Model) -> tf_keras.layers.Rescaling | None:
    """The Rescaling that takes the model's input, if its first layer is one."""
    layers = [layer for layer in model.layers if not isinstance(layer, tf_keras.layers.InputLayer)]
    return layers[0] if layers and isinstance(layers[0], tf_keras.layers.Rescaling) else None


def _layers_after(model: tf_keras.Model, front: tf_keras.layers.Layer) -> tf_keras.Model:
    """The model's layers after `front`, as a model of their own on front's output (weights shared)."""
    inputs = tf_keras.Input(front.output_shape[1:], name="scaled")
    tensors = {id(front.output): inputs}
    for layer in model.layers:
        if layer is front or isinstance(layer, tf_keras.layers.InputLayer):
            continue
        args = tf.nest.map_structure(lambda t: tensors[id(t)], layer.input)
        tensors[id(layer.output)] = layer(args)
    return tf_keras.Model(inputs, tf.nest.map_structure(lambda t: tensors[id(t)], model.outputs if len(model.outputs) > 1
                                                        else model.outputs[0]), name=f"{model.name}_quantized")


def _quantize_applied(model: tf_keras.Model, preserve: Preserve, float_layers: tuple[str, ...],
                      kernel_bits: dict[str, int]) -> tf_keras.Model:
    quant = tfmot.quantization.keras

    def annotate(layer: tf_keras.layers.Layer) -> tf_keras.layers.Layer:
        if layer.name in float_layers:
            return layer.__class__.from_config(layer.get_config())
        if layer.name in kernel_bits:  # a Dense or Conv2D (_check_layer_choices); a Conv2D's kernel per channel
            config = low_bit.LowBitKernelConfig(kernel_bits[layer.name], isinstance(layer, tf_keras.layers.Conv2D))
            return quant.quantize_annotate_layer(layer, config)
        return quant.quantize_annotate_layer(layer)

    annotated = tf_keras.models.clone_model(model, clone_function=annotate)
    annotated.set_weights(model.get_weights())
    if preserve is None:
        with quant.quantize_scope(low_bit.SCOPE):
            return quant.quantize_apply(annotated)
    combine = tfmot.experimental.combine
    scheme = (
        combine.Default8BitPrunePreserveQuantizeScheme()
        if preserve == "sparsity"
        else combine.Default8BitClusterPreserveQuantizeScheme()
    )
    return quant.quantize_apply(annotated, scheme)


def _flat_layers(model: tf_keras.Model) -> list[tf_keras.layers.Layer]:
    """A model's layers, those of a nested quantized body in its place."""
    return [inner for layer in model.layers
            for inner in (_flat_layers(layer) if isinstance(layer, tf_keras.Model) else [layer])]


def calibrate_ranges(qat: tf_keras.Model, plain: tf_keras.Model, observations: np.ndarray) -> dict[str, tuple[float, float]]:
    """Start QAT's quantizer ranges where the float model is, so the fake-quantized start plays
    like post-training int8 rather than like a broken policy.

    tfmot starts every range at [-6, 6] and sets a kernel's range only on its first training call:
    evaluated before that (as a fine-tune's best-snapshot selection does at step 0), a small
    student's kernels round to a few steps and the start plays one action. One training-mode call
    sets each kernel's range (last value). Activation ranges move slowly from [-6, 6] (a moving
    average), while a DQN's Q-values run to ~1/(1-gamma): set them from the float model's
    activations on replay observations, as PTQ calibrates.
    """
    x = np.asarray(observations, dtype=np.float32)
    qat(x[:256], training=True)  # kernel ranges, exactly as the first QAT step sets them
    for layer in plain.layers:  # the quantized input is what the first weight layer sees
        if isinstance(layer, tf_keras.layers.Rescaling):
            x = layer(x).numpy()
    ranges = {"quantize_layer": (float(x.min()), float(x.max()))}
    dense = weight_layers(plain)
    probe = tf_keras.Model(plain.inputs, [layer.output for layer in dense])
    for layer, out in zip(dense, probe(np.asarray(observations, dtype=np.float32))):
        out = out.numpy()
        ranges[f"quant_{layer.name}"] = (float(min(out.min(), 0.0)), float(max(out.max(), 0.0)))
    for layer in _flat_layers(qat):
        # The input quantizer is found by type: its name carries Keras's counter (quantize_layer_1, ..).
        name = "quantize_layer" if type(layer).__name__ == "QuantizeLayer" else layer.name
        if name not in ranges:
            continue
        lo, hi = ranges[name]
        prefix = "" if name == "quantize_layer" else "post_activation"  # a wrapper also holds kernel_min/max
        for weight in layer.non_trainable_weights:
            if weight.name.endswith(f"{prefix}_min:0"):
                weight.assign(lo)
            elif weight.name.endswith(f"{prefix}_max:0"):
                weight.assign(hi)
    return ranges


def behind_normalization(model: tf_keras.Model, normalization: Normalization) -> tf_keras.Model:
    """model (on z = (obs - mean) / std) behind a fixed layer that normalizes raw observations:
    what a fine-tune trains and the SavedModel serves. Trains model's own variables."""
    inputs = tf_keras.Input(model.input_shape[1:], name="observation")
    normalized = tf_keras.layers.Normalization(mean=normalization.mean, variance=np.square(normalization.std),
                                               name="input_normalization")(inputs)
    return tf_keras.Model(inputs, model(normalized), name=f"{model.name}_on_observations")


def representative_dataset(observations: np.ndarray) -> Callable[[], Iterator[list[np.ndarray]]]:
    """Calibration samples, one observation per batch, as the converter wants them."""

    def generate() -> Iterator[list[np.ndarray]]:
        for obs in observations:
            yield [np.asarray(obs[None], dtype=observations.dtype)]

    return generate


def converter_setup(
    cfg: QuantizeConfig | None,
    calibration: np.ndarray | None = None,
    sparse: bool = False,
) -> Callable[[tf.lite.TFLiteConverter], None]:
    """How to configure the TFLite converter for a variant (None: fp32)."""

    def configure(converter: tf.lite.TFLiteConverter) -> None:
        optimizations = []
        # weight_only converts in float: deploy.tflite.weight_only stores the kernels afterwards.
        if cfg is not None and cfg.mode != "weight_only":
            optimizations.append(tf.lite.Optimize.DEFAULT)
            if cfg.mode == "float16":
                converter.target_spec.supported_types = [tf.float16]
            if cfg.mode in ("int8", "int16x8"):
                if calibration is None:
                    raise ValueError(f"quantize.mode {cfg.mode} needs calibration observations")
                converter.representative_dataset = representative_dataset(calibration)
            if cfg.mode == "int8":
                converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
            if cfg.mode == "int16x8":
                # 16x8 has no ARG_MAX kernel: let that one op fall back to float (TFLite's documented way).
                converter.target_spec.supported_ops = [
                    tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8,
                    tf.lite.OpsSet.TFLITE_BUILTINS,
                ]
            if cfg.int8_io and cfg.mode in ("int8", "qat"):
                converter.inference_input_type = tf.int8
                converter.inference_output_type = tf.int8
        if sparse:
            optimizations.append(tf.lite.Optimize.EXPERIMENTAL_SPARSITY)
        converter.optimizations = optimizations

    return configure
