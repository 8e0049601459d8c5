"""ONNX Q-networks: a chain of Gemm/MatMul+Add, Conv, Relu/Tanh, Flatten/Reshape and scaling by a constant, as a PortedNet.

The graph is read with the `onnx` package (protobuf only: nothing in the file runs). Each node
must continue the single chain from the observation input to the Q-values; weights come from
initializers or Constant nodes. A scalar Div/Mul before the first weight layer becomes the input
Rescaling (SB3 exports `/255` this way); after a layer it is folded into that layer's weights. Any
other op is refused with its type and node named.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
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

SUPPORTED = ("Gemm", "MatMul", "Add", "Relu", "Tanh", "Conv", "Flatten", "Reshape", "Div", "Mul", "Cast", "Identity", "Constant")


def _import_onnx() -> Any:
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise UserError("baseline.from: reading an .onnx file needs the onnx package; "
                        "pip install 'compress-dqn[onnx]'") from None
    return onnx, numpy_helper


@dataclass(frozen=True)
class NodeAttrs:
    """The node attributes the chain reads, with ONNX's defaults where a node leaves one out."""

    value: Any = None
    """A Constant's TensorProto."""
    axis: int = 1
    to: int | None = None
    """A Cast's target element type."""
    strides: Sequence[int] = (1, 1)
    pads: Sequence[int] = (0,)
    dilations: Sequence[int] = (1,)
    group: int = 1
    auto_pad: bytes = b"NOTSET"
    transA: int = 0
    transB: int = 0
    alpha: float = 1.0
    beta: float = 1.0


_ATTR_NAMES = frozenset(f.name for f in fields(NodeAttrs))


class OnnxChain:
    """Walks the graph's nodes along the chain, building layers."""

    def __init__(self, path: Path, data: bytes) -> None:
        onnx, helper = _import_onnx()
        self.label = f"baseline.from: {path}"
        try:
            model = onnx.load_model_from_string(data)
        except Exception as exc:  # protobuf's DecodeError and friends: all mean "not an ONNX file"
            raise UserError(f"{self.label}: not an ONNX model ({str(exc)[:100]})") from None
        graph = model.graph
        self.consts = {init.name: helper.to_array(init) for init in graph.initializer}
        inputs = [i for i in graph.input if i.name not in self.consts]
        if len(inputs) != 1 or len(graph.output) != 1:
            raise UserError(f"{self.label}: {len(inputs)} inputs and {len(graph.output)} outputs; a Q-network maps "
                            "one observation input to one Q-value output")
        dims = inputs[0].type.tensor_type.shape.dim
        self.input_shape = tuple(int(d.dim_value) if d.dim_value else None for d in dims[1:])
        self.input_name, self.output_name = inputs[0].name, graph.output[0].name
        self.nodes, self.helper, self.onnx = list(graph.node), helper, onnx
        self.layers: list[Layer] = []
        self.scale: float | None = None

    def _const(self, name: str, node: Any) -> np.ndarray:
        if name not in self.consts:
            raise UserError(f"{self.label}: {node.op_type} node {node.name or '?'} takes {name} from the network's "
                            "data path, not a constant; not a plain feed-forward Q-network")
        return self.consts[name]

    def _attrs(self, node: Any) -> NodeAttrs:
        """The attributes the chain reads (no supported op depends on any other)."""
        return NodeAttrs(**{a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute
                            if a.name in _ATTR_NAMES})

    def walk(self) -> None:
        current = self.input_name
        for node in self.nodes:
            op, label = node.op_type, f"{node.op_type} node {node.name or '?'}"
            if op == "Constant":
                value = self._attrs(node).value
                if value is None:
                    raise UserError(f"{self.label}: {label}: only tensor-valued Constants are read")
                self.consts[node.output[0]] = self.helper.to_array(value)
                continue
            if op not in SUPPORTED:
                raise UserError(f"{self.label}: op {op} (node {node.name or '?'}) is not ported; supported ops: "
                                f"{', '.join(SUPPORTED)}")
            data_inputs = [i for i in node.input if i and i not in self.consts]
            if data_inputs != [current]:
                raise UserError(f"{self.label}: {label} does not continue the single chain from the input; "
                                "branching graphs are not ported")
            self._apply(node, op, label)
            current = node.output[0]
        if current != self.output_name:
            raise UserError(f"{self.label}: the chain ends at {current}, not at the graph's output {self.output_name}")
        if not self.layers:
            raise UserError(f"{self.label}: no Gemm/MatMul/Conv layer found")

    def _apply(self, node: Any, op: str, label: str) -> None:
        attrs = self._attrs(node)
        last = self.layers[-1] if self.layers else None
        if op in ("Relu", "Tanh"):
            if last is None or last.activation != "linear":
                raise UserError(f"{self.label}: {label}: an activation must directly follow a Gemm/MatMul/Conv layer")
            last.activation = op.lower()
        elif op in ("Flatten", "Reshape"):
            if op == "Flatten" and attrs.axis != 1:
                raise UserError(f"{self.label}: {label}: Flatten with axis {attrs.axis}; only axis 1 is ported")
            if op == "Reshape" and len(self._const(node.input[1], node)) != 2:
                raise UserError(f"{self.label}: {label}: only a Reshape to (batch, features) is ported")
            return  # Dense layers flatten their input (the builder adds Flatten before the first)
        elif op in ("Div", "Mul"):
            value = np.asarray(self._const(node.input[1], node), dtype=np.float64)
            if value.size != 1 or node.input[0] in self.consts:
                raise UserError(f"{self.label}: {label}: only scaling the data by one constant is ported")
            factor = float(1.0 / value.reshape(-1)[0] if op == "Div" else value.reshape(-1)[0])
            if last is None:
                self.scale = factor * (self.scale or 1.0)
            elif last.activation == "linear" or (last.activation == "relu" and factor > 0):
                last.kernel, last.bias = last.kernel * factor, last.bias * factor
            else:
                raise UserError(f"{self.label}: {label}: scaling after a {last.activation} activation is not ported")
        elif op == "Cast":
            if attrs.to not in (1, 11):  # FLOAT, DOUBLE
                raise UserError(f"{self.label}: {label}: a Cast to a non-float type is not ported")
        elif op == "Conv":
            self._conv(node, attrs, label)
        elif op in ("Gemm", "MatMul"):
            self._dense(node, op, attrs, label)
        elif op == "Add":
            if last is None or last.is_conv or np.any(last.bias) or last.activation != "linear":
                raise UserError(f"{self.label}: {label}: only a bias added to a MatMul (before its activation) is ported")
            last.bias = _bias(self._const(node.input[1], node), last.bias.shape[0], f"{self.label}: {label}")

    def _conv(self, node: Any, attrs: NodeAttrs, label: str) -> None:
        strides = list(attrs.strides)
        if (any(attrs.pads) or set(attrs.dilations) != {1} or attrs.group != 1
                or len(set(strides)) != 1 or attrs.auto_pad not in (b"NOTSET", b"VALID")):
            raise UserError(f"{self.label}: {label}: only unpadded, undilated, ungrouped convolutions with equal "
                            "strides are ported")
        weight = self._const(node.input[1], node)
        bias = self._const(node.input[2], node) if len(node.input) > 2 and node.input[2] else np.zeros(weight.shape[0])
        self.layers.append(Layer(conv_kernel(weight), bias.astype(np.float32), "linear", int(strides[0])))

    def _dense(self, node: Any, op: str, attrs: NodeAttrs, label: str) -> None:
        weight = np.asarray(self._const(node.input[1], node), dtype=np.float32)
        if op == "Gemm":
            if attrs.transA or attrs.alpha != 1.0 or attrs.beta != 1.0:
                raise UserError(f"{self.label}: {label}: only Gemm with alpha = beta = 1 and no transA is ported")
            kernel = weight.T if attrs.transB else weight
            bias = self._const(node.input[2], node) if len(node.input) > 2 and node.input[2] else np.zeros(kernel.shape[1])
        else:
            kernel, bias = weight, np.zeros(weight.shape[1])
        if kernel.ndim != 2:
            raise UserError(f"{self.label}: {label}: a {kernel.ndim}-D weight; only matrices are ported")
        bias = _bias(bias, kernel.shape[1], f"{self.label}: {label}")
        self.layers.append(Layer(np.ascontiguousarray(kernel, dtype=np.float32), bias.astype(np.float32), "linear"))


def _bias(value: np.ndarray, units: int, label: str) -> np.ndarray:
    """A bias of `units` values from a constant ONNX broadcasts to them ((N,), (1, N), a scalar)."""
    flat = np.asarray(value, dtype=np.float32).reshape(-1)
    if flat.size not in (1, units):
        raise UserError(f"{label}: a bias of {flat.size} values for {units} units is not ported")
    return np.broadcast_to(flat, (units,)).astype(np.float32)


def read_onnx(path: Path, data: bytes, obs_shape: tuple[int, ...]) -> tuple[PortedNet, bool]:
    """The PortedNet of an ONNX Q-network, and whether it took channel-first frames of the env's channel-last ones."""
    chain = OnnxChain(path, data)
    chain.walk()
    net = PortedNet(chain.layers, chain.scale, chain.label)
    shape = chain.input_shape
    transposed = len(obs_shape) == 3 and len(shape) == 3 and shape != tuple(obs_shape) and shape == (obs_shape[2], obs_shape[0], obs_shape[1])
    if not transposed and any(d is not None for d in shape) and tuple(shape) != tuple(obs_shape):
        raise UserError(f"{chain.label}: its input has shape {shape}, the environment's observations {tuple(obs_shape)}")
    n_conv = sum(layer.is_conv for layer in net.layers)
    if n_conv and not transposed:
        raise UserError(f"{chain.label}: ONNX convolutions take channel-first input; the environment gives {obs_shape}")
    if n_conv:
        h, w = conv_output_hw(tuple(obs_shape[:2]), net.layers)
        dense = net.layers[n_conv]
        try:
            dense.kernel = chw_rows_to_hwc(dense.kernel, net.layers[n_conv - 1].kernel.shape[3], h, w)
        except ValueError as exc:
            raise UserError(f"{chain.label}: {exc}") from None
    elif transposed:
        net.layers[0].kernel = chw_rows_to_hwc(net.layers[0].kernel, *shape)
    if transposed:
        net.notes.append("takes height x width x channel observations (the ONNX graph took them channel-first)")
    return net, transposed


def reference(data: bytes, transposed: bool) -> Any:
    """onnxruntime's run of the original file, on environment observations."""
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    feed = session.get_inputs()[0]
    dtype = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(uint8)": np.uint8}.get(feed.type, np.float32)

    def q_values(obs: np.ndarray) -> np.ndarray:
        x = np.transpose(obs, (0, 3, 1, 2)) if transposed else np.asarray(obs)
        return session.run(None, {feed.name: np.ascontiguousarray(x, dtype=dtype)})[0]

    return q_values
