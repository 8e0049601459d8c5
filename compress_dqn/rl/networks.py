"""Q-network builders (tf_keras Sequential, so tfmot can wrap them) and a numpy actor.

Acting calls the network once per environment step; a TensorFlow call costs hundreds of
microseconds, more than a CartPole or MinAtar step. `NumpyActor` runs the same forward pass (MLP
or a plain CNN) in numpy from a copy of the weights that the training loop refreshes after each
training phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from compress_dqn._tf import tf, tf_keras
from compress_dqn.recipe import layer_names


def build_q_network(
    obs_shape: Sequence[int],
    n_actions: int,
    net_arch: Sequence[int],
    activation: str = "relu",
    name: str = "q_network",
    conv: Sequence[Any] = (),
    input_scale: float | None = None,
    init: str = "fan_in_uniform",
    dueling: bool = False,
) -> tf_keras.Model:
    """Observations to one Q-value per action: optional Conv2D layers, then Dense layers.

    conv: layers with .filters, .kernel, .stride (a recipe's train.conv), channels-last input.
    input_scale: integer observations (uint8 pixels, MinAtar's 0/1 channels) are cast to float and
    multiplied by this in a first Rescaling layer, so the exported policy takes raw uint8 input.
    Multi-dimensional inputs are flattened before the Dense layers.
    init: "fan_in_uniform" draws kernels and biases from U(+-1/sqrt(fan_in)) (PyTorch's nn.Linear
    and nn.Conv2d default, so SB3/CleanRL hyperparameters transfer); "glorot_uniform" is Keras'
    default (Glorot kernels, zero biases).
    dueling: end in a value head and an advantage head, Q = V + A - mean_a A (a Functional model
    for training only: `fold_dueling` turns it into this function's plain Sequential, exactly).
    """
    if init not in INITIALIZERS:
        raise ValueError(f"unknown init {init!r}; choose from {', '.join(INITIALIZERS)}")
    if conv and len(obs_shape) != 3:
        raise ValueError(f"conv layers need (height, width, channels) observations, not shape {tuple(obs_shape)}")
    model = tf_keras.Sequential([tf_keras.layers.InputLayer(input_shape=tuple(obs_shape), name="obs")], name=name)
    if input_scale is not None:
        model.add(tf_keras.layers.Rescaling(float(input_scale), name="scale"))

    def weighted(layer_type: type, *args: Any, **kwargs: Any) -> None:
        fan_in = int(np.prod(model.output_shape[1:])) if layer_type is tf_keras.layers.Dense else None
        if layer_type is tf_keras.layers.Conv2D:
            fan_in = int(args[1]) ** 2 * int(model.output_shape[-1])
        model.add(layer_type(*args, **_initializers(init, fan_in), **kwargs))

    for i, spec in enumerate(conv):
        weighted(tf_keras.layers.Conv2D, int(spec.filters), int(spec.kernel), strides=int(spec.stride),
                 activation=activation, name=layer_names.conv(i))
    if len(obs_shape) > 1:
        model.add(tf_keras.layers.Flatten(name="flatten"))
    for i, width in enumerate(net_arch):
        weighted(tf_keras.layers.Dense, int(width), activation=activation, name=layer_names.hidden(i))
    if dueling:
        return _dueling_model(model, int(n_actions), init, name)
    weighted(tf_keras.layers.Dense, int(n_actions), name=layer_names.OUTPUT)
    return model


@tf_keras.utils.register_keras_serializable(package="compress_dqn")
class DuelingCombine(tf_keras.layers.Layer):
    """Q = V + A - mean_a A from [value (batch, 1), advantage (batch, n_actions)] (Wang et al. 2016)."""

    def call(self, inputs: list[tf.Tensor]) -> tf.Tensor:
        value, advantage = inputs
        return value + advantage - tf.reduce_mean(advantage, axis=1, keepdims=True)


def _dueling_model(body: tf_keras.Sequential, n_actions: int, init: str, name: str) -> tf_keras.Model:
    """The body's layers (weights kept), then a value head and an advantage head, combined."""
    inputs = tf_keras.Input(shape=body.input_shape[1:], name="obs")
    x = inputs
    for layer in body.layers:
        if not isinstance(layer, tf_keras.layers.InputLayer):
            x = layer(x)
    fan_in = int(x.shape[-1])
    value = tf_keras.layers.Dense(1, name="value", **_initializers(init, fan_in))(x)
    advantage = tf_keras.layers.Dense(n_actions, name="advantage", **_initializers(init, fan_in))(x)
    return tf_keras.Model(inputs, DuelingCombine(name=layer_names.OUTPUT)([value, advantage]), name=name)


def dueling_heads(model: tf_keras.Model) -> tuple[tf_keras.layers.Dense, tf_keras.layers.Dense] | None:
    """(value, advantage) layers of a network built with dueling=True, else None."""
    if isinstance(model, tf_keras.Sequential) or not model.layers or not isinstance(model.layers[-1], DuelingCombine):
        return None
    return model.get_layer("value"), model.get_layer("advantage")


def body_layers(model: tf_keras.Model) -> list[tf_keras.layers.Layer]:
    """The layers before the Q head (all but the InputLayer and the output layer or dueling heads)."""
    heads = 3 if dueling_heads(model) is not None else 1
    return [layer for layer in model.layers if not isinstance(layer, tf_keras.layers.InputLayer)][:-heads]


def _folded_head(value: tuple[np.ndarray, np.ndarray], advantage: tuple[np.ndarray, np.ndarray]) -> list[np.ndarray]:
    """One Dense layer's (kernel, bias) equal to V + A - mean_a A: the combination is linear."""
    (wv, bv), (wa, ba) = value, advantage
    return [wv + wa - wa.mean(axis=1, keepdims=True), bv + ba - ba.mean()]


def fold_dueling(model: tf_keras.Model) -> tf_keras.Model:
    """A dueling network as the plain Sequential network (one Dense Q head) computing the same
    Q-values; other models are returned as they are. What is exported and compressed is this
    network: the dueling head shapes learning, not the policy's size or speed."""
    heads = dueling_heads(model)
    if heads is None:
        return model
    body = body_layers(model)
    plain = tf_keras.Sequential([tf_keras.layers.InputLayer(input_shape=model.input_shape[1:], name="obs")], name=model.name)
    for layer in body:
        plain.add(layer.__class__.from_config(layer.get_config()))
    plain.add(tf_keras.layers.Dense(heads[1].units, name=layer_names.OUTPUT))
    weights = [w for layer in body for w in layer.get_weights()]
    plain.set_weights(weights + _folded_head(*(layer.get_weights() for layer in heads)))
    return plain


INITIALIZERS = ("fan_in_uniform", "glorot_uniform")
"""Weight initializations a recipe can ask for (train.init)."""


def _initializers(init: str, fan_in: int) -> dict[str, tf_keras.initializers.Initializer]:
    """Keras initializer arguments for one layer with `fan_in` inputs per output."""
    if init == "glorot_uniform":
        return {}
    bound = 1.0 / np.sqrt(fan_in)
    return {
        "kernel_initializer": tf_keras.initializers.RandomUniform(-bound, bound),
        "bias_initializer": tf_keras.initializers.RandomUniform(-bound, bound),
    }


def network_for(info: Any, cfg: Any, name: str = "q_network", dueling: bool = False) -> tf_keras.Model:
    """The network a recipe section describes (train or student: .net_arch, .activation, .conv)
    for an environment (an EnvInfo: .obs_shape, .n_actions, .input_scale). Plain unless dueling is
    asked for: only training builds the dueling form (train.dueling); the baseline it leaves is plain."""
    return build_q_network(
        info.obs_shape, info.n_actions, cfg.net_arch, cfg.activation, name=name,
        conv=getattr(cfg, "conv", ()), input_scale=info.input_scale, init=getattr(cfg, "init", "fan_in_uniform"),
        dueling=dueling,
    )


WEIGHT_LAYERS = (tf_keras.layers.Dense, tf_keras.layers.Conv2D)
"""The layer types compression acts on (pruning, clustering, QAT ranges, kernel reports)."""


def weight_layers(model: tf_keras.Model) -> list[tf_keras.layers.Layer]:
    """The layers compression acts on (Dense and Conv2D), in order."""
    return [layer for layer in model.layers if isinstance(layer, WEIGHT_LAYERS)]


def q_from_outputs(outputs):
    """Q-values from a network's outputs: a tensor, or (advantage, value[, action head]) from a split head."""
    if isinstance(outputs, (list, tuple)):
        advantage, value = outputs[:2]
        return advantage + value
    return outputs


def independent_copy(model: tf_keras.Model) -> tf_keras.Model:
    """A copy with its own variables (tfmot wrappers wrap layer objects in place)."""
    copy = tf_keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def count_params(model: tf_keras.Model) -> tuple[int, int]:
    """(parameters, nonzero parameters) over the model's weights."""
    weights = model.get_weights()
    return int(sum(w.size for w in weights)), int(sum(np.count_nonzero(w) for w in weights))


_ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0, out=x),
    "tanh": lambda x: np.tanh(x, out=x),
    "linear": lambda x: x,
}


class NumpyActor:
    """Greedy actions from a network's weights in numpy: no TensorFlow call on the acting path.

    A tf.function call costs several hundred microseconds here whatever it computes, far more than
    a CartPole or MinAtar step, so acting runs the same forward pass in numpy: Rescaling, Conv2D
    ('valid' padding, as im2col + matmul), Flatten and Dense layers.
    """

    def __init__(self, model: tf_keras.Model) -> None:
        if not self.supports(model):
            unsupported = [type(layer).__name__ for layer in model.layers if not self._layer_supported(layer)]
            raise TypeError(f"NumpyActor supports Rescaling/Conv2D/Flatten/Dense layers only, not {', '.join(unsupported)}")
        self._ops: list[tuple[Any, ...]] = []  # (kind, weight index or scale, stride, activation)
        n_weighted = 0
        heads = dueling_heads(model)
        layers = body_layers(model) if heads is not None else model.layers
        for layer in layers:
            if isinstance(layer, tf_keras.layers.Rescaling):
                self._ops.append(("scale", float(layer.scale), 0, "linear"))
            elif isinstance(layer, tf_keras.layers.Conv2D):
                self._ops.append(("conv", n_weighted, int(layer.strides[0]), layer.activation.__name__))
                n_weighted += 1
            elif isinstance(layer, tf_keras.layers.Dense):
                self._ops.append(("dense", n_weighted, 0, layer.activation.__name__))
                n_weighted += 1
        if heads is not None:  # the heads run folded into one Dense layer (see fold_dueling)
            self._ops.append(("dense", n_weighted, 0, "linear"))
            layers = [*layers, *heads]
        self._variables = [v for layer in layers if layer.weights for v in (layer.kernel, layer.bias)]
        self._dueling = heads is not None
        self._weights: list[tuple[np.ndarray, np.ndarray]] = []
        self._read_weights: Any = None
        self.refresh()

    @staticmethod
    def _layer_supported(layer: tf_keras.layers.Layer) -> bool:
        if isinstance(layer, tf_keras.layers.Flatten):
            return True
        if isinstance(layer, tf_keras.layers.Rescaling):
            return float(layer.offset) == 0.0 and np.ndim(layer.scale) == 0
        if isinstance(layer, tf_keras.layers.Conv2D):
            return (
                type(layer) is tf_keras.layers.Conv2D and layer.padding == "valid" and layer.use_bias
                and layer.data_format == "channels_last" and tuple(layer.dilation_rate) == (1, 1)
                and layer.groups == 1 and layer.strides[0] == layer.strides[1]
                and layer.activation.__name__ in _ACTIVATIONS
            )
        return isinstance(layer, tf_keras.layers.Dense) and layer.use_bias and layer.activation.__name__ in _ACTIVATIONS

    @classmethod
    def supports(cls, model: tf_keras.Model) -> bool:
        """Whether this actor can run the model (plain layers or a dueling head; no tfmot wrappers or split heads)."""
        if dueling_heads(model) is not None:
            return all(cls._layer_supported(layer) for layer in body_layers(model))
        return isinstance(model, tf_keras.Sequential) and all(cls._layer_supported(layer) for layer in model.layers)

    def refresh(self) -> None:
        """Copy the current weights (call after each training phase).

        One compiled read of every variable, not model.get_weights() (one eager read each): a run
        refreshes after each of its tens of thousands of phases (docs/lunarlander-training.md).
        Same values, same order."""
        if self._read_weights is None:
            variables = self._variables
            self._read_weights = tf.function(lambda: [tf.identity(v) for v in variables]).get_concrete_function()
        flat = [tensor.numpy() for tensor in self._read_weights()]
        self._weights = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]
        if self._dueling:
            *self._weights, value, advantage = self._weights
            self._weights.append(tuple(_folded_head(value, advantage)))

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values for a batch of observations, shape (batch, n_actions)."""
        x = np.asarray(obs, dtype=np.float32)
        for kind, ref, stride, activation in self._ops:
            if kind == "scale":
                x = x * np.float32(ref)
                continue
            kernel, bias = self._weights[ref]
            if kind == "conv":
                kh, kw, channels, filters = kernel.shape
                windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
                n, ho, wo = windows.shape[:3]
                # windows: (n, ho, wo, channels, kh, kw) -> rows of (kh, kw, channels), the kernel's order.
                patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * ho * wo, kh * kw * channels)
                x = (patches @ kernel.reshape(-1, filters)).reshape(n, ho, wo, filters)
            else:
                x = x.reshape(len(x), -1) @ kernel
            x += bias
            x = _ACTIVATIONS[activation](x)
        return x

    def act(self, obs: np.ndarray) -> int:
        """Greedy action for one observation."""
        return int(np.argmax(self.q_values(obs[None])[0]))


class KerasActor:
    """Greedy actions through a compiled tf.function, for networks NumpyActor cannot run (wrapped, split)."""

    def __init__(self, model: tf_keras.Model) -> None:
        fn = tf.function(lambda x: q_from_outputs(model(x, training=False)))
        inputs = getattr(model, "inputs", None)
        self._dtype = None
        if inputs and len(inputs) == 1:
            # One traced signature, called directly: a polymorphic tf.function spends more time
            # matching each call's arguments than a small network's forward pass takes (a QAT
            # student playing its DAgger states: 1.2 ms a step against 0.5 ms, the same Q-values).
            self._dtype = inputs[0].dtype.as_numpy_dtype
            fn = fn.get_concrete_function(tf.TensorSpec([None, *inputs[0].shape[1:]], inputs[0].dtype))
        self._fn = fn

    def refresh(self) -> None:
        """Nothing to copy: the function reads the live variables."""

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs) if self._dtype is None else np.asarray(obs, dtype=self._dtype)
        return self._fn(tf.constant(x)).numpy()

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q_values(obs[None])[0]))


def make_actor(model: tf_keras.Model) -> NumpyActor | KerasActor:
    """The fastest actor that can run this model."""
    return NumpyActor(model) if NumpyActor.supports(model) else KerasActor(model)
