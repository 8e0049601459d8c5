"""Q-network builders (tf_keras Sequential, so tfmot can wrap them) and a numpy actor.

Acting calls the network once per environment step; an eager TensorFlow call costs ~100 us,
more than a CartPole step. `NumpyActor` runs the same MLP forward pass in numpy from a copy of
the weights that the training loop refreshes after each training phase.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from compress_dqn._tf import tf_keras


def build_q_network(
    obs_shape: Sequence[int],
    n_actions: int,
    net_arch: Sequence[int],
    activation: str = "relu",
    name: str = "q_network",
) -> tf_keras.Sequential:
    """An MLP from observations to one Q-value per action (multi-dimensional inputs are flattened)."""
    layers: list[tf_keras.layers.Layer] = [tf_keras.layers.InputLayer(input_shape=tuple(obs_shape), name="obs")]
    if len(obs_shape) > 1:
        layers.append(tf_keras.layers.Flatten(name="flatten"))
    for i, width in enumerate(net_arch):
        layers.append(tf_keras.layers.Dense(int(width), activation=activation, name=f"hidden_{i}"))
    layers.append(tf_keras.layers.Dense(int(n_actions), name="q_values"))
    return tf_keras.Sequential(layers, name=name)


def q_from_outputs(outputs):
    """Q-values from a network's outputs: a tensor, or (advantage, value) from a split head."""
    if isinstance(outputs, (list, tuple)):
        advantage, value = outputs
        return advantage + value
    return outputs


def split_value_advantage(model: tf_keras.Model) -> tf_keras.Model:
    """Rewrite the output layer Q = W h + b as two heads: advantage A = (W - mean_a W) h + (b - mean b)
    and value V = mean_a(W) h + mean(b), so Q = A + V exactly and argmax Q = argmax A.

    Why: a DQN's action gaps are tiny next to its Q-values (CartPole: ~0.06 on ~100), and an
    int8 output with one range for all Q-values rounds the gap away. Separate heads get separate
    quantization ranges, and the action is taken from the advantage head's fine one.
    """
    layers = [layer for layer in model.layers if not isinstance(layer, tf_keras.layers.InputLayer)]
    *body, head = layers
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
    """Greedy actions from an MLP's weights in numpy: no TensorFlow call on the acting path."""

    def __init__(self, model: tf_keras.Model) -> None:
        self._layers: list[tuple[str, int]] = []  # (activation name, weight index)
        for layer in model.layers:
            if isinstance(layer, tf_keras.layers.Flatten):
                continue
            if not isinstance(layer, tf_keras.layers.Dense):
                raise TypeError(f"NumpyActor supports Dense/Flatten layers only, not {type(layer).__name__}")
            name = layer.activation.__name__
            if name not in _ACTIVATIONS:
                raise TypeError(f"NumpyActor does not support activation {name!r}")
            self._layers.append((name, len(self._layers)))
        self._model = model
        self._weights: list[tuple[np.ndarray, np.ndarray]] = []
        self.refresh()

    @staticmethod
    def supports(model: tf_keras.Model) -> bool:
        """Whether the model is a plain MLP this actor can run."""
        return all(
            isinstance(layer, tf_keras.layers.Flatten)
            or (isinstance(layer, tf_keras.layers.Dense) and layer.activation.__name__ in _ACTIVATIONS)
            for layer in model.layers
        )

    def refresh(self) -> None:
        """Copy the current weights (call after each training phase)."""
        flat = self._model.get_weights()
        self._weights = [(flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)]

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values for a batch of observations, shape (batch, n_actions)."""
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        for (activation, i) in self._layers:
            kernel, bias = self._weights[i]
            x = x @ kernel
            x += bias
            x = _ACTIVATIONS[activation](x)
        return x

    def act(self, obs: np.ndarray) -> int:
        """Greedy action for one observation."""
        return int(np.argmax(self.q_values(obs[None])[0]))


class KerasActor:
    """Greedy actions through a compiled tf.function, for networks NumpyActor cannot run (CNNs)."""

    def __init__(self, model: tf_keras.Model) -> None:
        from compress_dqn._tf import tf

        self._fn = tf.function(lambda x: q_from_outputs(model(x, training=False)))

    def refresh(self) -> None:
        """Nothing to copy: the function reads the live variables."""

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self._fn(np.asarray(obs)).numpy()

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q_values(obs[None])[0]))


def make_actor(model: tf_keras.Model) -> NumpyActor | KerasActor:
    """The fastest actor that can run this model."""
    return NumpyActor(model) if NumpyActor.supports(model) else KerasActor(model)
