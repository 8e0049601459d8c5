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

        self._fn = tf.function(lambda x: model(x, training=False))

    def refresh(self) -> None:
        """Nothing to copy: the function reads the live variables."""

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self._fn(np.asarray(obs)).numpy()

    def act(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q_values(obs[None])[0]))


def make_actor(model: tf_keras.Model) -> NumpyActor | KerasActor:
    """The fastest actor that can run this model."""
    return NumpyActor(model) if NumpyActor.supports(model) else KerasActor(model)
