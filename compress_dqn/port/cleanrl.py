"""CleanRL-style PyTorch state dicts (torch.save(q_network.state_dict())): layers inferred from tensor names and shapes.

A state dict holds weights, not the forward pass, so the network is inferred the way CleanRL writes
its Q-networks: nn.Sequential Linear/ReLU (classic control) and Conv2d/ReLU/Flatten/Linear (Atari,
the Nature DQN convolutions with strides 4, 2, 1, on `x / 255`). Layers run in the order of their
names (network.0, network.2, ... or fc1, fc2, ...); ReLU between them; the last is linear. What
cannot be inferred (a layer's kind, an order that does not chain, a stride) is refused in one line
that names it and the way to supply it (an ONNX export records the whole forward pass).
"""

from __future__ import annotations

import io
import re
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port.spec import (
    Layer,
    PortedNet,
    chw_rows_to_hwc,
    conv_kernel,
    conv_output_hw,
)

NATURE_STRIDES = {8: 4, 4: 2, 3: 1}  # the Nature DQN convolutions: kernel -> stride
ONNX_HINT = ("export the network to ONNX instead (torch.onnx.export(q_network, obs, 'q.onnx')), which records "
             "the whole forward pass, and pass the .onnx file")


def _natural(key: str) -> list[Any]:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", key)]


def _groups(state: dict[str, np.ndarray], label: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, weight, bias) per layer, in name order; anything that is not a layer's weight or bias refused."""
    prefixes = sorted({key.rsplit(".", 1)[0] for key in state}, key=_natural)
    layers = []
    for prefix in prefixes:
        weight, bias = state.get(f"{prefix}.weight"), state.get(f"{prefix}.bias")
        extra = sorted(k for k in state if k.rsplit(".", 1)[0] == prefix and k.rsplit(".", 1)[-1] not in ("weight", "bias"))
        if extra or weight is None or weight.ndim not in (2, 4):
            what = extra[0] if extra else (f"{prefix}.weight of shape {weight.shape}" if weight is not None else f"{prefix} (no weight)")
            raise UserError(f"{label}: cannot infer a Linear or Conv2d layer from {what}; only Linear/Conv2d "
                            f"layers with ReLU are inferred from a state dict: {ONNX_HINT}")
        if bias is None:
            bias = np.zeros(weight.shape[0], dtype=np.float32)
        layers.append((prefix, weight, bias))
    if not layers:
        raise UserError(f"{label}: holds no tensors; save torch.save(q_network.state_dict(), path)")
    return layers


def infer(state: dict[str, np.ndarray], label: str, obs_shape: tuple[int, ...], obs_dtype: Any,
          n_actions: int) -> tuple[PortedNet, list[tuple[str, int]], bool]:
    """The PortedNet, the (name, stride) of each layer for the reference forward pass, and whether
    the source took channel-first frames of the environment's channel-last ones."""
    groups = _groups(state, label)
    layers: list[Layer] = []
    order: list[tuple[str, int]] = []
    convs = [g for g in groups if g[1].ndim == 4]
    if convs and any(g[1].ndim == 4 for g in groups[len(convs):]):
        raise UserError(f"{label}: cannot infer the layer order: Conv2d layers come after Linear ones in name order; {ONNX_HINT}")
    transposed = False
    if convs:
        if len(obs_shape) != 3:
            raise UserError(f"{label}: has Conv2d layers but the environment's observations have shape {obs_shape}")
        channels = convs[0][1].shape[1]
        if channels != obs_shape[-1]:
            raise UserError(f"{label}: its first Conv2d takes {channels} channels, the environment's frames have "
                            f"{obs_shape[-1]} (shape {obs_shape}); check --frame-stack")
        transposed = True  # CleanRL stacks frames channel-first; the environment here gives them last
    previous = convs[0][1].shape[1] if convs else int(np.prod(obs_shape))
    for i, (name, weight, bias) in enumerate(groups):
        last = i == len(groups) - 1
        if weight.ndim == 4:
            kernel = int(weight.shape[2])
            if weight.shape[2] != weight.shape[3] or kernel not in NATURE_STRIDES:
                raise UserError(f"{label}: cannot infer the stride of Conv2d {name} ({weight.shape[2]}x{weight.shape[3]} "
                                f"kernel; the Nature DQN's 8x8, 4x4, 3x3 are known): {ONNX_HINT}")
            stride = NATURE_STRIDES[kernel]
            layers.append(Layer(conv_kernel(weight), bias.astype(np.float32), "linear" if last else "relu", stride))
        else:
            stride = 0
            layers.append(Layer(np.ascontiguousarray(weight.T, dtype=np.float32), bias.astype(np.float32),
                                "linear" if last else "relu"))
        if int(weight.shape[1]) != previous and not (weight.ndim == 2 and layers[-2:-1] and layers[-2].is_conv):
            raise UserError(f"{label}: cannot infer the layer order: {name} takes {weight.shape[1]} inputs but the "
                            f"layer before it gives {previous}; {ONNX_HINT}")
        previous = int(weight.shape[0])
        order.append((name, stride))
    if layers[-1].is_conv or layers[-1].kernel.shape[1] != n_actions:
        raise UserError(f"{label}: its last layer gives {previous} outputs, the environment has {n_actions} actions")
    scale = 1.0 / 255.0 if convs and np.dtype(obs_dtype) == np.uint8 else None
    net = PortedNet(layers, scale, label)
    if convs:
        h, w = conv_output_hw((obs_shape[0], obs_shape[1]), layers)
        dense = layers[len(convs)]
        try:
            dense.kernel = chw_rows_to_hwc(dense.kernel, layers[len(convs) - 1].kernel.shape[3], h, w)
        except ValueError as exc:
            raise UserError(f"{label}: {order[len(convs)][0]}: {exc} on {obs_shape} frames; check --env") from None
        net.notes.append("Nature DQN strides 4, 2, 1 inferred from the 8x8, 4x4, 3x3 kernels")
        if scale is not None:
            net.notes.append("observations scaled by 1/255 in the network, as CleanRL's QNetwork does (x / 255.0)")
    return net, order, transposed


def reference(data: bytes, order: list[tuple[str, int]], transposed: bool, scale: float | None) -> Any:
    """The same forward pass in torch, on tensors torch itself loads (weights_only=True)."""
    import torch
    import torch.nn.functional as F

    state = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")

    def q_values(obs: np.ndarray) -> np.ndarray:
        x = torch.as_tensor(np.transpose(obs, (0, 3, 1, 2)) if transposed else np.asarray(obs)).float()
        if scale is not None:
            x = x / 255.0
        with torch.no_grad():
            for i, (name, stride) in enumerate(order):
                weight, bias = state[f"{name}.weight"], state.get(f"{name}.bias")
                if weight.ndim == 4:
                    x = F.conv2d(x, weight, bias, stride=stride)
                else:
                    x = F.linear(x.flatten(1), weight, bias)
                if i < len(order) - 1:
                    x = F.relu(x)
        return x.numpy()

    return q_values
