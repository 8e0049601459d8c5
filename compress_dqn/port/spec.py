"""A ported Q-network as plain arrays (what every importer produces) and the tf_keras model built from it.

Importers read PyTorch or ONNX layouts (channel-first convolutions, (out, in) matrices) and hand
over this one description in Keras's layout, so a single builder makes the model the rest of the
product compresses: an optional input Rescaling, valid-padding Conv2D layers, Flatten, Dense layers.
Those are the layers every compression, the NumPy actor and TFLite Micro take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compress_dqn._tf import tf_keras
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError


@dataclass
class Layer:
    """One weight layer in Keras layout: Dense kernel (in, out) or Conv2D kernel (kh, kw, in, out)."""

    kernel: np.ndarray
    bias: np.ndarray
    activation: str = "relu"
    stride: int = 1

    @property
    def is_conv(self) -> bool:
        return self.kernel.ndim == 4


@dataclass
class PortedNet:
    """A Q-network read from a file: input scale, weight layers in order, and what it came from."""

    layers: list[Layer]
    input_scale: float | None = None
    source: str = ""
    notes: list[str] = field(default_factory=list)


def conv_kernel(weight: np.ndarray) -> np.ndarray:
    """PyTorch/ONNX (out, in, kh, kw) -> Keras (kh, kw, in, out)."""
    return np.ascontiguousarray(np.transpose(weight, (2, 3, 1, 0)), dtype=np.float32)


def conv_output_hw(hw: tuple[int, int], layers: list[Layer]) -> tuple[int, int]:
    """Height and width after the valid-padding convolutions."""
    h, w = hw
    for layer in layers:
        if layer.is_conv:
            kh, kw = layer.kernel.shape[:2]
            h, w = (h - kh) // layer.stride + 1, (w - kw) // layer.stride + 1
    return h, w


def chw_rows_to_hwc(kernel: np.ndarray, channels: int, h: int, w: int) -> np.ndarray:
    """Reorder a Dense kernel's input rows from a channel-first flatten (c, h, w) to Keras's (h, w, c).

    PyTorch flattens conv features channel by channel; Keras's Flatten after a channels-last conv
    goes pixel by pixel. Permuting the rows keeps one Dense layer (no Permute layer in the model).
    """
    if kernel.shape[0] != channels * h * w:
        raise ValueError(f"expected {channels * h * w} inputs after the convolutions, the layer has {kernel.shape[0]}")
    index = np.arange(channels * h * w).reshape(channels, h, w).transpose(1, 2, 0).reshape(-1)
    return np.ascontiguousarray(kernel[index])


def absorb_normalization(net: PortedNet, normalization: Normalization) -> None:
    """(obs - mean) / std absorbed into the first Dense layer, in place, so the net takes raw
    observations: W' = W / std, b' = b - (mean / std) W (the opposite of rewrites.normalize_model_input)."""
    first = net.layers[0]
    if first.is_conv or net.input_scale is not None:
        raise UserError("VecNormalize statistics apply to flat observations here; a CNN policy trained behind "
                        "VecNormalize(norm_obs=True) is not supported: retrain with norm_obs=False")
    mean, std = normalization.mean.reshape(-1).astype(np.float64), normalization.std.reshape(-1).astype(np.float64)
    if mean.shape[0] != first.kernel.shape[0]:
        raise UserError(f"VecNormalize statistics cover {mean.shape[0]} observation values, the network takes "
                        f"{first.kernel.shape[0]}; they belong to another environment")
    kernel = first.kernel.astype(np.float64)
    first.bias = (first.bias - (mean / std) @ kernel).astype(np.float32)
    first.kernel = (kernel / std[:, None]).astype(np.float32)


def build_keras(net: PortedNet, obs_shape: tuple[int, ...], name: str) -> Any:
    """The tf_keras Sequential model computing `net` on raw observations of `obs_shape`."""

    model = tf_keras.Sequential([tf_keras.layers.InputLayer(input_shape=tuple(obs_shape), name="obs")], name=name)
    if net.input_scale is not None:
        model.add(tf_keras.layers.Rescaling(float(net.input_scale), name="scale"))
    flattened = len(obs_shape) == 1
    weights: list[np.ndarray] = []
    n_conv = n_dense = 0
    for i, layer in enumerate(net.layers):
        last = i == len(net.layers) - 1
        if layer.is_conv:
            kh, kw, _, filters = layer.kernel.shape
            model.add(tf_keras.layers.Conv2D(filters, (kh, kw), strides=layer.stride, padding="valid",
                                             activation=layer.activation, name=f"conv{n_conv}"))
            n_conv += 1
        else:
            if not flattened:
                model.add(tf_keras.layers.Flatten(name="flatten"))
                flattened = True
            model.add(tf_keras.layers.Dense(layer.kernel.shape[1], activation=layer.activation,
                                            name="q_values" if last else f"dense{n_dense}"))
            n_dense += 1
        weights += [layer.kernel.astype(np.float32), layer.bias.astype(np.float32)]
    try:
        model.set_weights(weights)
    except ValueError as exc:
        raise UserError(f"{net.source}: its layer shapes do not chain on {tuple(obs_shape)} observations "
                        f"({str(exc)[:160]})") from None
    return model

