"""Plays an `export --target onnx` file in PyTorch on any device: an interpreter of exactly the ops the export writes.

Why: a GPU machine without TensorFlow (and without onnxruntime's CUDA build) can still measure a policy
file on its GPU, and onnx2torch converts none of the int8 exports. Each node runs as one torch call
on the file's own tensors, in the file's order; nothing is fused or reordered, so a CUDA graph of one
call replays the same kernels. What each kind of op computes:
- float ops (Gemm, Conv, elementwise) in float32, with TF32 off on CUDA: last bits may differ from
  onnxruntime's sums, so an action can differ on a near tie (the bench counts them);
- MatMulInteger / ConvInteger in float64 (CUDA has no integer matmul or conv): every product and
  partial sum is an integer far below 2^53, so the result is exact, rounded back to int32;
- integer elementwise ops (the requantization of the exact int8 form, the dynamic-range form's
  rounding) in their own int32 / int64 dtypes, exactly; integer Div truncates, Mod follows the divisor;
- QuantizeLinear / DequantizeLinear (the `--onnx-int8 qdq` form) as ONNX defines them, in float
  (round half to even, saturate): the int8 products run as float ops on dequantized weights, as
  onnxruntime's unfused reference; its fused CPU kernels round their own way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

import numpy as np

from compress_dqn.errors import UserError

if TYPE_CHECKING:
    from torch import Tensor

INTEGER_NOTE = ("float ops in float32 (TF32 off); MatMulInteger/ConvInteger exactly in float64; integer "
                "requantization in int32/int64; QDQ as float ops on dequantized weights")
"""What the interpreter does with each kind of op, for the bench's record."""

_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}
_STATIC = {"Reshape": (1,), "Pad": (1, 2, 3), "ReduceMin": (1,), "ReduceMax": (1,)}
"""Inputs read as Python values when the graph is loaded (shapes, pads, axes): a CUDA graph cannot read device memory."""



class Attributes(TypedDict, total=False):
    """A node's ONNX attributes that an op reads (onnx.helper.get_attribute_value's values), and its inputs
    read as Python values at load (_inN: input N, one of _STATIC's)."""

    pads: list[int]
    strides: list[int]
    dilations: list[int]
    kernel_shape: list[int]
    group: int
    transA: int
    transB: int
    alpha: float
    beta: float
    axis: int
    axes: list[int]
    keepdims: int
    select_last_index: int
    allowzero: int
    fmod: int
    mode: bytes
    to: int
    perm: list[int]
    _in1: list[int]
    _in2: float | int
    _in3: list[int]


Op = Callable[[list[Any], Attributes], Any]


def _torch() -> Any:
    import torch

    return torch


def _centered(x: Any, zero: Any) -> Any:
    """x - zero point in float64 (exact for uint8 / int8 values)."""
    x = x.to(_torch().float64)
    return x if zero is None else x - zero.to(x.dtype)


def _exact_int32(x: Any) -> Any:
    return _torch().round(x).to(_torch().int32)


def _conv2d(x: Any, w: Any, bias: Any, at: Attributes) -> Any:
    """ONNX Conv geometry (pads begin..., end...) on torch's conv2d; x already in the product's dtype."""
    import torch.nn.functional as F

    top, left, bottom, right = at.get("pads", [0, 0, 0, 0])
    if (top, left) != (bottom, right):
        x, top, left = F.pad(x, (left, right, top, bottom)), 0, 0
    return F.conv2d(x, w, bias, stride=tuple(at.get("strides", [1, 1])), padding=(top, left),
                    dilation=tuple(at.get("dilations", [1, 1])), groups=at.get("group", 1))


def _gemm(a: list[Any], at: Attributes) -> Any:
    x, w = a[0], a[1]
    x = x.t() if at.get("transA") else x
    w = w.t() if at.get("transB") else w
    y = x @ w
    if at.get("alpha", 1.0) != 1.0:
        y = y * at["alpha"]
    if len(a) > 2 and a[2] is not None:
        y = y + (a[2] if at.get("beta", 1.0) == 1.0 else a[2] * at["beta"])
    return y


def _matmul_integer(a: list[Any], at: Attributes) -> Any:
    x_zero = a[2] if len(a) > 2 else None
    if x_zero is not None and x_zero.dim() == 1:
        x_zero = x_zero.reshape(-1, 1)
    return _exact_int32(_centered(a[0], x_zero) @ _centered(a[1], a[3] if len(a) > 3 else None))


def _conv_integer(a: list[Any], at: Attributes) -> Any:
    w_zero = a[3] if len(a) > 3 else None
    if w_zero is not None and w_zero.dim() == 1:
        w_zero = w_zero.reshape(-1, 1, 1, 1)
    return _exact_int32(_conv2d(_centered(a[0], a[2] if len(a) > 2 else None), _centered(a[1], w_zero), None, at))


def _along(v: Any, axis: int, rank: int) -> Any:
    """A per-axis scale or zero point shaped to broadcast along `axis` of a rank-`rank` tensor."""
    if v is None or v.dim() == 0:
        return v
    shape = [1] * rank
    shape[axis % rank] = -1
    return v.reshape(shape)


def _quantize_linear(a: list[Any], at: Attributes) -> Any:
    torch = _torch()
    x, rank = a[0], a[0].dim()
    scale, zero = _along(a[1], at.get("axis", 1), rank), _along(a[2] if len(a) > 2 else None, at.get("axis", 1), rank)
    dtype = zero.dtype if zero is not None else torch.uint8
    info = torch.iinfo(dtype)
    y = torch.round(x / scale) + (0 if zero is None else zero.to(x.dtype))
    return torch.clamp(y, info.min, info.max).to(dtype)


def _dequantize_linear(a: list[Any], at: Attributes) -> Any:
    torch = _torch()
    x, rank = a[0], a[0].dim()
    scale, zero = _along(a[1], at.get("axis", 1), rank), _along(a[2] if len(a) > 2 else None, at.get("axis", 1), rank)
    centered = x.to(torch.int32) - (0 if zero is None else zero.to(torch.int32))
    return centered.to(scale.dtype) * scale


def _div(a: list[Any], at: Attributes) -> Any:
    x, y = a
    if x.dtype.is_floating_point:
        return x / y
    return _torch().div(x, y, rounding_mode="trunc")


def _mod(a: list[Any], at: Attributes) -> Any:
    return (_torch().fmod if at.get("fmod", 0) else _torch().remainder)(a[0], a[1])


def _reshape(a: list[Any], at: Attributes) -> Any:
    shape = [a[0].shape[i] if d == 0 and not at.get("allowzero", 0) else d for i, d in enumerate(at["_in1"])]
    return a[0].reshape(shape)


def _flatten(a: list[Any], at: Attributes) -> Any:
    axis = at.get("axis", 1) % max(a[0].dim(), 1)
    return a[0].reshape(int(np.prod(a[0].shape[:axis])), -1)


def _pad(a: list[Any], at: Attributes) -> Any:
    import torch.nn.functional as F

    if at.get("mode", b"constant") not in (b"constant", "constant") or at.get("_in3") is not None:
        raise UserError("Pad: only constant padding over every axis is an op `export --target onnx` writes")
    pads, rank = at["_in1"], a[0].dim()
    order = [p for d in reversed(range(rank)) for p in (pads[d], pads[d + rank])]
    value = at.get("_in2")
    return F.pad(a[0], order, value=float(value) if value is not None else 0.0)


def _reduce(name: str) -> Op:
    def run(a: list[Any], at: Attributes) -> Any:
        axes = at.get("axes", at.get("_in1"))
        fn = getattr(_torch(), name)
        return fn(a[0], dim=tuple(axes) if axes is not None else None, keepdim=bool(at.get("keepdims", 1)))
    return run


def _argmax(a: list[Any], at: Attributes) -> Any:
    if at.get("select_last_index", 0):
        raise UserError("ArgMax with select_last_index is not an op `export --target onnx` writes")
    return _torch().argmax(a[0], dim=at.get("axis", 0), keepdim=bool(at.get("keepdims", 1)))  # the first maximum


def _cast(a: list[Any], at: Attributes) -> Any:
    return a[0].to(getattr(_torch(), _DTYPES[at["to"]]))


def _clip(a: list[Any], at: Attributes) -> Any:
    low, high = (a[i] if len(a) > i else None for i in (1, 2))
    return _torch().clamp(a[0], min=low, max=high)


def _variadic(name: str) -> Op:
    def run(a: list[Any], at: Attributes) -> Any:
        out = a[0]
        for other in a[1:]:
            out = getattr(_torch(), name)(out, other)
        return out
    return run


def _call(name: str) -> Op:
    """An op that is one torch function of its inputs (unary, binary or Where)."""
    def run(a: list[Any], at: Attributes) -> Any:
        return getattr(_torch(), name)(*a)
    return run


OPS: dict[str, Op] = {
    "Gemm": _gemm, "Conv": lambda a, at: _conv2d(a[0], a[1], a[2] if len(a) > 2 else None, at),
    "MatMulInteger": _matmul_integer, "ConvInteger": _conv_integer,
    "Transpose": lambda a, at: a[0].permute(*at["perm"]), "Reshape": _reshape, "Flatten": _flatten,
    "Relu": _call("relu"), "Clip": _clip, "Sub": _call("sub"), "Mul": _call("mul"), "Add": _call("add"), "Div": _div,
    "Mod": _mod, "Cast": _cast, "ArgMax": _argmax, "Identity": lambda a, at: a[0],
    "QuantizeLinear": _quantize_linear, "DequantizeLinear": _dequantize_linear, "Pad": _pad,
    "ReduceMin": _reduce("amin"), "ReduceMax": _reduce("amax"), "Where": _call("where"), "Equal": _call("eq"),
    "Less": _call("lt"), "Greater": _call("gt"), "GreaterOrEqual": _call("ge"), "LessOrEqual": _call("le"),
    "Abs": _call("abs"), "Sign": _call("sign"), "Round": _call("round"), "Min": _variadic("minimum"),
    "Max": _variadic("maximum"),
}
"""Every op `export --target onnx` writes (fp32, both int8 forms, dynamic range), and nothing else."""


def read_onnx(path: Path) -> Any:
    """The ModelProto of an .onnx file, or a one-line UserError naming what is wrong."""
    try:
        import onnx
    except ImportError:
        raise UserError("reading an .onnx policy needs the onnx package: pip install 'compress-dqn[onnx]'") from None
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file; pass the .onnx that `compress-dqn export POLICY.tflite --target onnx` writes")
    try:
        return onnx.load_model(str(path))
    except Exception as exc:  # a truncated or foreign file: protobuf's DecodeError and kin
        raise UserError(f"{path}: not an ONNX model ({type(exc).__name__}); export it again with --target onnx") from None


class OnnxTorchPolicy:
    """An exported ONNX policy on a torch device: `forward` maps a batch of observations (a device tensor) to
    the action tensor, `actions` numpy in and out."""

    def __init__(self, model: Any, device: str, label: str = "policy.onnx") -> None:
        from onnx import helper, numpy_helper

        torch = _torch()
        graph = model.graph
        unknown = sorted({n.op_type for n in graph.node} - set(OPS))
        if unknown:
            raise UserError(f"{label}: ops {', '.join(unknown)} are not ones `export --target onnx` writes; "
                            "bench --device plays those exports only (export the .tflite again with --target onnx)")
        host = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.device = torch.device(device)
        self.values = {name: torch.from_numpy(np.array(v)).to(self.device) for name, v in host.items()}
        self.nodes: list[tuple[Op, list[str], str, Attributes]] = []
        for node in graph.node:
            attrs = cast(Attributes, {a.name: helper.get_attribute_value(a) for a in node.attribute})
            inputs = list(node.input)
            for i in _STATIC.get(node.op_type, ()):
                if i < len(inputs) and inputs[i]:
                    if inputs[i] not in host:
                        raise UserError(f"{label}: {node.op_type}'s input {i} is computed; the exports hold it constant")
                    attrs[f"_in{i}"] = host[inputs[i]].tolist()  # type: ignore[literal-required]
                    inputs[i] = ""
            self.nodes.append((OPS[node.op_type], inputs, node.output[0], attrs))
        self.input = graph.input[0].name
        dims = graph.input[0].type.tensor_type.shape.dim
        self.obs_shape = tuple(d.dim_value for d in dims[1:])
        self.input_dtype = np.dtype(_DTYPES[graph.input[0].type.tensor_type.elem_type])
        self.outputs = [o.name for o in graph.output]
        self.weights_bytes = sum(v.numel() * v.element_size() for v in self.values.values())

    def run(self, x: Tensor) -> dict[str, Tensor]:
        """Every output of the graph for a batch of observations on the device."""
        env = {**self.values, self.input: x}
        for op, inputs, output, attrs in self.nodes:
            env[output] = op([env[name] if name else None for name in inputs], attrs)
        return {name: env[name] for name in self.outputs}

    def forward(self, x: Any) -> Any:
        """The action tensor (int32, [batch])."""
        return self.run(x)["action"]

    def actions(self, observations: np.ndarray) -> np.ndarray:
        """Greedy actions of a numpy batch."""
        x = _torch().from_numpy(np.ascontiguousarray(observations, dtype=self.input_dtype)).to(self.device)
        return self.forward(x).cpu().numpy()
