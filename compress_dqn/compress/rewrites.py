"""Exact rewrites of a trained Q-network that make it quantize well: a split value/advantage head,
an action-choosing head, the units feeding float heads equalized, and input normalization folded
into the first layer.

Each returns a new tf_keras model computing the same Q-values (or the same greedy action) as the
one it was given; compress.build picks which a variant gets.
"""

from __future__ import annotations

import numpy as np

from compress_dqn._tf import tf_keras
from compress_dqn.envs.normalization import Normalization
from compress_dqn.rl.networks import body_layers, independent_copy, weight_layers


SPLIT_HEADS = ("advantage", "value")
"""The layer names of split_value_advantage's two heads."""


def split_value_advantage(model: tf_keras.Model) -> tf_keras.Model:
    """Rewrite the output layer Q = W h + b as two heads: advantage A = (W - mean_a W) h + (b - mean b)
    and value V = mean_a(W) h + mean(b), so Q = A + V exactly and argmax Q = argmax A.

    Why: a DQN's action gaps are tiny next to its Q-values (CartPole: ~0.06 on ~100), and an
    int8 output with one range for all Q-values rounds the gap away. Separate heads get separate
    quantization ranges, and the action is taken from the advantage head's fine one.
    """
    body, head = body_layers(model), model.layers[-1]
    if not isinstance(head, tf_keras.layers.Dense):
        raise TypeError(f"the last layer must be Dense to split it, not {type(head).__name__}")
    inputs = tf_keras.Input(shape=model.input_shape[1:], name="obs")
    x = inputs
    for layer in body:
        x = layer.__class__.from_config(layer.get_config())(x)
    advantage = tf_keras.layers.Dense(head.units, name="advantage")(x)
    value = tf_keras.layers.Dense(1, name="value")(x)
    split = tf_keras.Model(inputs, [advantage, value], name=f"{model.name}_split")
    for layer in body:
        split.get_layer(layer.name).set_weights(layer.get_weights())
    kernel, bias = head.get_weights()
    split.get_layer("advantage").set_weights([kernel - kernel.mean(1, keepdims=True), bias - bias.mean()])
    split.get_layer("value").set_weights([kernel.mean(1, keepdims=True), bias.mean(keepdims=True)])
    return split


def flattened_dense_as_conv(model: tf_keras.Model) -> tf_keras.Model:
    """A split-head model (advantage, value) whose first Dense layer on a flattened conv output is
    rewritten exactly as a convolution over that whole output (kernel = the feature map's height x
    width, valid padding), then flattened: the same weights, the same outputs.

    Why: tfmot's QAT gives a Dense kernel one scale (its Dense config), and the converter cannot
    take a per-unit scale through the kernel transpose a FULLY_CONNECTED needs; its conv config and
    CONV_2D take one scale per output channel. The layer after a conv stack holds nearly all of a
    CNN's weights (MinAtar's baseline: 1024x128), and one scale for it rounds the units with small
    weights to a few steps. Returns the model unchanged where no Dense follows a Flatten of a 4-D tensor.
    """
    heads = [model.get_layer(name) for name in SPLIT_HEADS]
    body = [layer for layer in model.layers
            if not isinstance(layer, tf_keras.layers.InputLayer) and layer not in heads]
    at = next((i for i, layer in enumerate(body[:-1]) if isinstance(layer, tf_keras.layers.Flatten)
               and len(layer.input_shape) == 4 and isinstance(body[i + 1], tf_keras.layers.Dense)), None)
    if at is None:
        return model
    flatten, dense = body[at], body[at + 1]
    height, width, channels = flatten.input_shape[1:]
    inputs = tf_keras.Input(shape=model.input_shape[1:], name="obs")
    x, weights = inputs, {}
    for i, layer in enumerate(body):
        if i == at:
            continue
        if i == at + 1:
            conv = tf_keras.layers.Conv2D(dense.units, (height, width), activation=dense.activation, name=dense.name)
            x = tf_keras.layers.Flatten(name=flatten.name)(conv(x))
            kernel, bias = dense.get_weights()
            weights[dense.name] = [kernel.reshape(height, width, channels, dense.units), bias]
            continue
        x = layer.__class__.from_config(layer.get_config())(x)
        weights[layer.name] = layer.get_weights()
    outputs = [head.__class__.from_config(head.get_config())(x) for head in heads]
    rewritten = tf_keras.Model(inputs, outputs, name=f"{model.name}_conv")
    for name, values in [*weights.items(), *((head.name, head.get_weights()) for head in heads)]:
        if values:
            rewritten.get_layer(name).set_weights(values)
    return rewritten


def equalize_head_input(model: tf_keras.Model, observations: np.ndarray) -> tf_keras.Model:
    """A split-head model (advantage, value) whose layer feeding the heads has each relu unit scaled
    to span the same range on `observations` (the widest unit's), the heads' weights from that
    unit divided by the same factor: the same Q-values (relu(s z) = s relu(z) for s > 0).

    Why: an int8 activation tensor has one range for all its units. On MinAtar Space Invaders'
    baseline pruned to 95% and QAT'd, the 128 units feeding the heads used a median of 10 of the
    tensor's 255 steps over 2,000 replay states, a quarter of them 4 or fewer (docs/minatar.md).
    Float heads (quantize.float_head) take the inverse factors exactly; int8 heads would see their
    weights' ranges change, so it is for float heads only. Returns the model unchanged where that
    layer is not a Dense or Conv2D with relu.
    """
    heads = [model.get_layer(name) for name in SPLIT_HEADS]
    feeding = [layer for layer in model.layers if layer not in heads][-1]  # split_value_advantage's order
    if (not isinstance(feeding, (tf_keras.layers.Dense, tf_keras.layers.Conv2D))
            or feeding.get_config().get("activation") != "relu"):
        return model
    # The heads' input, as with_action_head reads it.
    features = tf_keras.Model(model.inputs, heads[0].input)
    reach = features(np.asarray(observations, dtype=np.float32)).numpy()
    reach = reach.reshape(-1, reach.shape[-1]).max(axis=0)
    scale = np.ones_like(reach, dtype=np.float32)
    live = reach > 0  # units that never fire on these states keep their weights: no range to match
    scale[live] = reach.max() / reach[live]
    copy = independent_copy(model)
    kernel, bias = feeding.get_weights()
    copy.get_layer(feeding.name).set_weights([kernel * scale, bias * scale])
    for head in heads:
        head_kernel, head_bias = head.get_weights()
        copy.get_layer(head.name).set_weights([head_kernel / scale[:, None], head_bias])
    return copy


def input_statistics(observations: np.ndarray) -> Normalization:
    """Per-feature mean and std of flat float observations (std floored, so constant features pass)."""
    x = np.asarray(observations, dtype=np.float64).reshape(len(observations), -1)
    std = x.std(axis=0)
    return Normalization(x.mean(axis=0).astype(np.float32), np.where(std > 1e-6, std, 1.0).astype(np.float32))


def input_range(observations: np.ndarray) -> Normalization:
    """Per-feature midrange and half-range of flat float observations (floored as input_statistics's
    std): (obs - midrange) / half-range puts every feature in [-1, 1].

    Why: post-training int8 gives the whole input tensor the range of the calibration batch's
    extremes. After (obs - mean) / std, one heavy-tailed feature (a LunarLander leg contact, 1 on a
    few states) sets that range to tens of std and leaves the others a few dozen steps; scaled by
    their ranges, every feature gets all 256 steps.
    """
    x = np.asarray(observations, dtype=np.float64).reshape(len(observations), -1)
    low, high = x.min(axis=0), x.max(axis=0)
    half = (high - low) / 2
    return Normalization(((low + high) / 2).astype(np.float32), np.where(half > 1e-6, half, 1.0).astype(np.float32))


def with_action_head(model: tf_keras.Model, observations: np.ndarray, floor_share: float = 0.125) -> tf_keras.Model:
    """A split-head model (advantage, value) plus a third output that only chooses the action:
    relu6(k (A + c)), with hi the largest best-action advantage on `observations`, c = floor_share
    x hi and k = 6 / (hi + c). Its argmax is argmax A wherever the best advantage is at most hi.

    Why: an int8 tensor has 256 steps over its calibrated range, and the advantage head's range
    runs from the worst action's advantage on the worst state to the best one's (CartPole: -45..45
    next to a median action gap of 0.06). The action only needs the top of that range: every
    advantage below 0 is below the best one (advantages average to 0 over actions), so the floor
    at -c loses no decision, and ReLU6 fuses into the int8 FULLY_CONNECTED, whose output range
    then is [-c, hi]. The q_values output keeps the advantage head.
    """
    advantage_layer = model.get_layer("advantage")
    features = tf_keras.Model(model.inputs, advantage_layer.input)
    kernel, bias = advantage_layer.get_weights()
    advantage = features(np.asarray(observations, dtype=np.float32)).numpy() @ kernel + bias
    high = max(float(advantage.max(axis=1).max()), 1e-6)
    floor = floor_share * high
    scale = 6.0 / (high + floor)
    head = tf_keras.layers.Dense(kernel.shape[1], activation="relu6", name="action_head")
    outputs = [*model.outputs, head(advantage_layer.input)]
    extended = tf_keras.Model(model.inputs, outputs, name=f"{model.name}_action_head")
    head.set_weights([kernel * scale, (bias + floor) * scale])
    return extended


def normalize_model_input(model: tf_keras.Model, normalization: Normalization) -> tf_keras.Model:
    """A copy that takes z = (obs - mean) / std and computes what model computes on obs (the
    opposite of port.spec.absorb_normalization, which makes a net on z take obs).

    Exact in float: the first Dense layer's W x + b becomes (W * std) z + (b + mean W). Why: an
    integer-quantized policy has one scale for its whole input tensor, so a feature with a small
    range (CartPole's pole angle next to its velocities) rounds to a few steps; normalized features
    share one range. The policy loader applies the normalization (see tflite_metadata).
    """
    first = weight_layers(model)[0]
    if not isinstance(first, tf_keras.layers.Dense) or len(model.input_shape) != 2:
        raise TypeError("input normalization folds into a first Dense layer on flat observations only")
    copy = independent_copy(model)
    kernel, bias = first.get_weights()
    copy.get_layer(first.name).set_weights([kernel * normalization.std[:, None], bias + normalization.mean @ kernel])
    return copy
