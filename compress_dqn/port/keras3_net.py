"""A checked Keras 3 graph folded into a PortedNet: Dense and Conv2D layers, the rest folded exactly into them.

Rescaling, Normalization and BatchNormalization are affine maps of the tensor they take: one right
after a linear Dense or Conv2D (BatchNormalization's usual place) folds into that layer's outputs,
any other into the next layer's inputs. Before the first layer they are the policy's input
normalization: an image network keeps a uniform scale as its input Rescaling (as the package's own
CNNs take uint8 frames, and integer exports keep it in front of the quantized body, in the file)
and folds offsets and per-channel parts into the first convolution; a flat network folds them into
its first Dense layer, so the recipe's `quantize.normalize_input` normalizes the input of its
integer exports as for every policy. Dropout is the identity at inference. A Permute that moves
channel-first frames' channels last is dropped: the port takes the environment's channel-last
frames. A dueling head (V + A - mean(A), from Dense, Mean, Add, Subtract) is linear in the shared
features, so it folds into one Dense layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port.keras3_file import layer_name
from compress_dqn.port.keras3_graph import Graph
from compress_dqn.port.spec import Layer, PortedNet

ACTIVATIONS = ("relu", "tanh", "linear")
KERAS_EPSILON = 1e-7  # keras.backend.epsilon(), Normalization's floor on sqrt(variance)


class Folder:
    """Walks the chain, keeping weight layers and folding every affine layer into one of them."""

    def __init__(self, graph: Graph, weights: dict[str, list[np.ndarray]], obs_shape: tuple[int, ...], label: str) -> None:
        self.weights, self.label = weights, label
        self.shape = tuple(graph.input_shape)
        self.obs_shape = tuple(obs_shape)
        self.layers: list[Layer] = []
        self.pending: tuple[np.ndarray, np.ndarray] | None = None
        self.out_open = False  # the current tensor is the last layer's output before any nonlinearity
        self.act_open = False  # the last layer's activation can still be set
        self.input_scale: float | None = None
        self.transposed = False
        self.notes: list[str] = []
        self.folding: list[str] = []  # the affine layers in the pending map
        self.names: list[str] = []  # each weight layer's name in the file

    def arrays(self, layer: dict, count: int) -> list[np.ndarray]:
        name = layer_name(layer)
        arrays = self.weights.get(name, [])
        if len(arrays) != count:
            raise UserError(f"{self.label}: layer {name} has {len(arrays)} weight arrays in the file, expected {count}; "
                            "save the model again")
        return [np.asarray(a, dtype=np.float64) for a in arrays]

    def activation_of(self, value: Any, name: str) -> str:
        value = "linear" if value is None else value
        if value not in ACTIVATIONS:
            raise UserError(f"{self.label}: layer {name} uses activation {value!r}; ported activations: "
                            f"{', '.join(ACTIVATIONS)}")
        return str(value)

    # -- the chain ------------------------------------------------------------------------------

    def step(self, layer: dict) -> None:
        cls, config, name = layer["class_name"], layer["config"], layer_name(layer)
        if cls in ("InputLayer", "Dropout"):
            return
        if cls == "Dense":
            self.dense(layer)
        elif cls == "Conv2D":
            self.conv(layer)
        elif cls == "Flatten":
            self.flatten()
        elif cls == "Permute":
            self.permute([int(d) for d in config.get("dims", [])], name)
        elif cls in ("ReLU", "Activation"):
            self.activate(self._relu(config, name) if cls == "ReLU" else self.activation_of(config.get("activation"), name), name)
        else:
            self.affine(*affine_of(layer, self.shape, self.weights, self.label), name)

    def _relu(self, config: dict, name: str) -> str:
        if config.get("max_value") is not None or config.get("negative_slope") or config.get("threshold"):
            raise UserError(f"{self.label}: layer {name} is a ReLU with max_value, negative_slope or threshold; only "
                            "the plain ReLU is ported")
        return "relu"

    def affine(self, scale: np.ndarray, offset: np.ndarray, name: str) -> None:
        """x -> scale * x + offset, both of the current tensor's shape."""
        channel = _per_channel(scale, offset)
        if self.pending is None and self.out_open and channel is not None:
            last = self.layers[-1]
            last.kernel, last.bias = last.kernel * channel[0], last.bias * channel[0] + channel[1]
            self.notes.append(f"{name} folded into {self.names[-1]}")
            return
        if self.pending is not None:
            scale, offset = scale * self.pending[0], scale * self.pending[1] + offset
        self.pending = (scale, offset)
        self.folding.append(name)
        self.act_open = False

    def activate(self, activation: str, name: str) -> None:
        if activation == "linear":
            return
        last = self.layers[-1] if self.layers else None
        if last is not None and self.pending is None and not self.act_open and last.activation == activation == "relu":
            return  # relu(relu(x)) = relu(x)
        if last is None or self.pending is not None or not self.act_open:
            raise UserError(f"{self.label}: layer {name}: an activation is ported only right after a Dense or Conv2D "
                            "layer (or its BatchNormalization)")
        last.activation = activation
        self.act_open = self.out_open = False

    def flatten(self) -> None:
        if len(self.shape) > 1:
            if self.pending is not None:
                self.pending = (self.pending[0].reshape(-1), self.pending[1].reshape(-1))
            self.shape = (int(np.prod(self.shape)),)
            self.out_open = False

    def permute(self, dims: list[int], name: str) -> None:
        if dims == list(range(1, len(self.shape) + 1)):
            return
        if self.layers or self.transposed or len(self.shape) != 3 or dims != [2, 3, 1]:
            raise UserError(f"{self.label}: layer {name}: Permute{tuple(dims)} on {self.shape}; only Permute((2, 3, 1)) "
                            "on the input, moving channel-first frames' channels last, is ported")
        if self.pending is not None:
            self.pending = (np.transpose(self.pending[0], (1, 2, 0)), np.transpose(self.pending[1], (1, 2, 0)))
        self.shape = (self.shape[1], self.shape[2], self.shape[0])
        self.transposed = True
        self.notes.append("takes height x width x channel frames (the model moved channel-first frames' channels last "
                          "with Permute)")

    def dense(self, layer: dict) -> None:
        config, name = layer["config"], layer_name(layer)
        if len(self.shape) != 1:
            raise UserError(f"{self.label}: layer {name}: a Dense on a {self.shape} tensor acts per position; put a "
                            "Flatten before it")
        arrays = self.arrays(layer, 2 if config.get("use_bias", True) else 1)
        kernel = arrays[0]
        bias = arrays[1] if len(arrays) > 1 else np.zeros(kernel.shape[-1])
        if kernel.shape != (self.shape[0], int(config.get("units", -1))):
            raise UserError(f"{self.label}: layer {name}'s kernel has shape {kernel.shape}; expected "
                            f"({self.shape[0]}, {config.get('units')})")
        self.add(kernel, bias, self.activation_of(config.get("activation"), name), 1, name)

    def conv(self, layer: dict) -> None:
        config, name = layer["config"], layer_name(layer)
        strides = [int(s) for s in config.get("strides", (1, 1))]
        if (config.get("padding", "valid") != "valid" or config.get("data_format") not in (None, "channels_last")
                or [int(d) for d in config.get("dilation_rate", (1, 1))] != [1, 1] or int(config.get("groups", 1)) != 1
                or len(set(strides)) != 1):
            raise UserError(f"{self.label}: layer {name}: only valid-padding, channels-last, undilated, ungrouped "
                            "Conv2D layers with equal strides are ported")
        if len(self.shape) != 3:
            raise UserError(f"{self.label}: layer {name}: a Conv2D on a {self.shape} tensor; expected height x width x channels")
        arrays = self.arrays(layer, 2 if config.get("use_bias", True) else 1)
        kernel = arrays[0]
        bias = arrays[1] if len(arrays) > 1 else np.zeros(kernel.shape[-1])
        if kernel.ndim != 4 or kernel.shape[2] != self.shape[2]:
            raise UserError(f"{self.label}: layer {name}'s kernel has shape {kernel.shape} on {self.shape} input")
        self.add(kernel, bias, self.activation_of(config.get("activation"), name), strides[0], name)

    def add(self, kernel: np.ndarray, bias: np.ndarray, activation: str, stride: int, name: str) -> None:
        """A weight layer, with the pending affine map of its input folded into it."""
        if self.pending is not None:
            kernel, bias = self._absorb(kernel, bias, name)
        if kernel.ndim == 4:
            kh, kw = kernel.shape[:2]
            h, w = (self.shape[0] - kh) // stride + 1, (self.shape[1] - kw) // stride + 1
            if h < 1 or w < 1:
                raise UserError(f"{self.label}: layer {name}: a {kh}x{kw} kernel does not fit {self.shape[:2]}")
            self.shape = (h, w, int(kernel.shape[3]))
        else:
            self.shape = (int(kernel.shape[1]),)
        self.layers.append(Layer(kernel, bias, activation, stride))
        self.names.append(name)
        self.out_open = self.act_open = activation == "linear"

    def _absorb(self, kernel: np.ndarray, bias: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        scale, offset = self.pending
        self.pending, folding, self.folding = None, self.folding, []
        if not self.layers and len(self.shape) == 3 and np.all(scale == scale.reshape(-1)[0]) and scale.reshape(-1)[0] > 0:
            self.input_scale = float(scale.reshape(-1)[0])  # kept as the input Rescaling: uint8 frames in
            scale = np.ones_like(scale)
            self.notes.append(f"observations scaled by {self.input_scale:.6g} in the network's input Rescaling "
                              f"({', '.join(folding)})")
            if not np.any(offset):
                return kernel, bias
        self.notes.append(f"{', '.join(folding)} folded into {name}")
        if kernel.ndim == 2:
            scale, offset = scale.reshape(-1), offset.reshape(-1)
            return kernel * scale[:, None], bias + offset @ kernel
        channel = _per_channel(scale, offset)
        if channel is None:
            raise UserError(f"{self.label}: layer {name}: the normalization before it differs from pixel to pixel, "
                            "which does not fold into a convolution; normalize per channel")
        return kernel * channel[0][None, None, :, None], bias + np.einsum("hwio,i->o", kernel, channel[1])

    def finish(self) -> None:
        if self.pending is not None:
            raise UserError(f"{self.label}: the model ends in a normalization that does not fold into its last layer")
        if not self.layers:
            raise UserError(f"{self.label}: the model has no Dense or Conv2D layer")


def fold_head(folder: Folder, graph: Graph) -> None:
    """The layers after the fork, each an affine map (K, c) of the fork's features; the output one Dense layer."""
    values: dict[str, Any] = {graph.fork: None}  # None: the fork's features themselves
    for layer, parents in graph.head:
        cls, name = layer["class_name"], layer_name(layer)
        inputs = [values[p] for p in parents]
        if cls in MERGE_OPS:
            if any(v is None for v in inputs) or len(inputs) < 2 or (cls == "Subtract" and len(inputs) != 2):
                raise UserError(f"{folder.label}: layer {name}: {cls} is ported on the outputs of linear Dense layers, "
                                "as a dueling head adds its value and advantage streams")
            values[name] = MERGE_OPS[cls](inputs)
            continue
        if len(inputs) != 1:
            raise UserError(f"{folder.label}: layer {name} takes {len(inputs)} inputs; not ported")
        values[name] = _head_step(folder, layer, inputs[0], name)
    out = values[graph.output]
    if out is None:
        raise UserError(f"{folder.label}: the model's output is its shared features; no Q-value layer")
    folder.add(out[0], out[1], "linear", 1, "the dueling head")
    folder.notes.append("dueling head (V + A - mean(A), Add/Subtract) folded into one Dense layer, exactly: "
                        "it is linear in the shared features")


def _head_step(folder: Folder, layer: dict, value: Any, name: str) -> Any:
    cls, config = layer["class_name"], layer["config"]
    if cls in ("Dropout", "InputLayer"):
        return value
    if cls == "Flatten":
        if value is None:
            folder.flatten()
        return value
    if cls == "Activation" and config.get("activation") in (None, "linear"):
        return value
    if cls == "Dense" and folder.activation_of(config.get("activation"), name) == "linear":
        if value is None and len(folder.shape) != 1:
            raise UserError(f"{folder.label}: layer {name}: a Dense on a {folder.shape} tensor acts per position; put "
                            "a Flatten before it")
        kernel, bias = _dense_after(folder, layer, folder.shape[0] if value is None else value[1].shape[0], name)
        return (kernel, bias) if value is None else (value[0] @ kernel, value[1] @ kernel + bias)
    if cls == "Mean" and value is not None:
        axis = config.get("axis")
        if axis not in (-1, 1, [-1], [1]) or not config.get("keepdims"):
            raise UserError(f"{folder.label}: layer {name}: only a mean over the actions with keepdims=True is ported")
        return value[0].mean(axis=1, keepdims=True), value[1].mean(keepdims=True)
    if cls in ("Rescaling", "BatchNormalization", "Normalization") and value is not None:
        scale, offset = affine_of(layer, (value[1].shape[0],), folder.weights, folder.label)
        return value[0] * scale, value[1] * scale + offset
    raise UserError(f"{folder.label}: layer {name} ({cls}) after the network branches; a dueling head's streams are "
                    "single linear Dense layers on the shared features, combined with Mean, Add and Subtract")


def _dense_after(folder: Folder, layer: dict, width: int, name: str) -> tuple[np.ndarray, np.ndarray]:
    config = layer["config"]
    arrays = folder.arrays(layer, 2 if config.get("use_bias", True) else 1)
    kernel = arrays[0]
    if kernel.shape != (width, int(config.get("units", -1))):
        raise UserError(f"{folder.label}: layer {name}'s kernel has shape {kernel.shape} on {width} inputs")
    return kernel, (arrays[1] if len(arrays) > 1 else np.zeros(kernel.shape[1]))


def _broadcast(values: list[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
    units = max(v[1].shape[0] for v in values)
    if any(v[1].shape[0] not in (1, units) for v in values):
        raise UserError(f"cannot combine streams of {[v[1].shape[0] for v in values]} units")
    return [(np.broadcast_to(k, (k.shape[0], units)), np.broadcast_to(c, (units,))) for k, c in values]


def _add(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    values = _broadcast(values)
    return sum(v[0] for v in values), sum(v[1] for v in values)


def _subtract(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    (k1, c1), (k2, c2) = _broadcast(values)
    return k1 - k2, c1 - c2


MERGE_OPS = {"Add": _add, "Subtract": _subtract}


def _per_channel(scale: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale, offset) per last-axis channel where they do not vary over the other axes, else None."""
    if scale.ndim <= 1:
        return scale, offset
    flat_s, flat_o = scale.reshape(-1, scale.shape[-1]), offset.reshape(-1, offset.shape[-1])
    if np.all(flat_s == flat_s[0]) and np.all(flat_o == flat_o[0]):
        return flat_s[0], flat_o[0]
    return None


def affine_of(layer: dict, shape: tuple[int, ...], weights: dict[str, list[np.ndarray]], label: str
              ) -> tuple[np.ndarray, np.ndarray]:
    """(scale, offset) of shape `shape` that Rescaling, Normalization or BatchNormalization applies."""
    cls, config, name = layer["class_name"], layer["config"], layer_name(layer)
    arrays = [np.asarray(a, dtype=np.float64) for a in weights.get(name, [])]
    try:
        if cls == "Rescaling":
            scale = np.broadcast_to(np.asarray(config.get("scale", 1.0), dtype=np.float64), shape)
            return scale, np.broadcast_to(np.asarray(config.get("offset", 0.0), dtype=np.float64), shape)
        axes = config.get("axis", -1)
        axes = [axes] if isinstance(axes, int) else list(axes or [])
        keep = sorted(a if a >= 0 else a + len(shape) + 1 for a in axes)
        if any(a < 1 or a > len(shape) for a in keep):
            raise ValueError(f"axis {config.get('axis')} on a {shape} tensor")
        stats = (len(shape) + 0) * [1]
        for a in keep:
            stats[a - 1] = shape[a - 1]
        kept = tuple(shape[a - 1] for a in keep)
        if cls == "BatchNormalization":
            return _batch_norm(config, arrays, kept, stats, shape, len(shape) in keep)
        mean, variance = config.get("mean"), config.get("variance")
        if mean is None or variance is None:
            if len(arrays) < 2:
                raise ValueError("no mean and variance in its config or weights")
            mean, variance = arrays[0], arrays[1]
        mean = np.broadcast_to(np.asarray(mean, dtype=np.float64), kept).reshape(stats)
        variance = np.broadcast_to(np.asarray(variance, dtype=np.float64), kept).reshape(stats)
        std = np.maximum(np.sqrt(variance), KERAS_EPSILON)
        scale, offset = (std, mean) if config.get("invert") else (1.0 / std, -mean / std)
        return np.broadcast_to(scale, shape), np.broadcast_to(offset, shape)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{label}: layer {name} ({cls}) cannot be read as a per-feature scale and offset on a {shape} "
                        f"tensor ({str(exc)[:100]})") from None


def _batch_norm(config: dict, arrays: list[np.ndarray], kept: tuple[int, ...], stats: list[int],
                shape: tuple[int, ...], last_axis: bool) -> tuple[np.ndarray, np.ndarray]:
    """Inference BatchNormalization: gamma (x - mean) / sqrt(var + eps) + beta."""
    count = 2 + bool(config.get("scale", True)) + bool(config.get("center", True))
    if len(arrays) != count or not last_axis or len(kept) != 1:
        raise ValueError(f"{len(arrays)} weight arrays (expected {count}) on axis {config.get('axis')}; "
                         "BatchNormalization over the last axis is ported")
    gamma = arrays.pop(0) if config.get("scale", True) else np.ones(kept)
    beta = arrays.pop(0) if config.get("center", True) else np.zeros(kept)
    mean, variance = arrays
    scale = gamma / np.sqrt(variance + float(config.get("epsilon", 1e-3)))
    return (np.broadcast_to(scale.reshape(stats), shape), np.broadcast_to((beta - mean * scale).reshape(stats), shape))


def fold(graph: Graph, weights: dict[str, list[np.ndarray]], obs_shape: tuple[int, ...], label: str
         ) -> tuple[PortedNet, bool]:
    """The PortedNet of a checked graph, and whether it took channel-first frames of the env's channel-last ones."""
    folder = Folder(graph, weights, obs_shape, label)
    shape = tuple(graph.input_shape)
    permuted = len(obs_shape) == 3 and shape == (obs_shape[2], obs_shape[0], obs_shape[1])
    if shape != tuple(obs_shape) and not permuted:
        raise UserError(f"{label}: its input shape is {shape} but the environment's observations are {tuple(obs_shape)}")
    for layer in graph.chain:
        folder.step(layer)
    if graph.head:
        fold_head(folder, graph)
    folder.finish()
    if permuted and not folder.transposed:
        raise UserError(f"{label}: its input shape is {shape} (channel-first) but the environment's observations are "
                        f"{tuple(obs_shape)}; give the network channel-last frames or begin it with Permute((2, 3, 1))")
    layers = [Layer(np.ascontiguousarray(l.kernel, dtype=np.float32), np.asarray(l.bias, dtype=np.float32),
                    l.activation, l.stride) for l in folder.layers]
    return PortedNet(layers, folder.input_scale, label, folder.notes), folder.transposed
