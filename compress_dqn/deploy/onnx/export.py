"""`export --target onnx`: a .tflite policy as ONNX for onnxruntime (and Unity, Godot, TensorRT, OpenVINO).

An int8 file's ops repeat LiteRT's reference int8 kernels in standard integer ops (integer.py:
uint8 x uint8 products, the requantization written out), so its actions are the reference kernels'
on any CPU (`int8="exact"`, the default); `int8="qdq"` writes QuantizeLinear/DequantizeLinear pairs
around float ops instead, which onnxruntime fuses into the integer kernels of the CPU it runs on:
smaller and faster, but those round their own way (ties to even, float requantization, and on AVX2
CPUs without VNNI other kernels than on AVX-512 ones), so actions can differ on states at a rounding
boundary. A float file (fp32, float16) becomes fp32 ONNX, its weights widened; a dynamic-range
file's hybrid layers repeat LiteRT's hybrid arithmetic in standard ops (hybrid.py), bit for bit.
The model takes raw observations (`observations`, the environment's dtype and layout: the
normalization is inside, an int8-input policy's too) and gives `action` (int32, the policy) and
`q_values` (float), whose argmax is the action wherever the .tflite's is. Float layers compute the
same functions as LiteRT's, summed in onnxruntime's order: their last bits can differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from compress_dqn.deploy.onnx import integer as onnx_integer
from compress_dqn.deploy.onnx.hybrid import conv_hybrid, fc_hybrid, is_hybrid
from compress_dqn.deploy.base import ExportOptions, ExportReport, policy_name
from compress_dqn.deploy.tflite.graph import Op, PolicyGraph, Tensor, conv_geometry, hybrid_inexact, read_policy_graph
from compress_dqn.errors import UserError

Int8Form = Literal["exact", "qdq"]
INT8_FORMS: tuple[Int8Form, ...] = ("exact", "qdq")

OPSET = 17
_BINARY = {"SUB": "Sub", "DIV": "Div", "MUL": "Mul", "ADD": "Add"}


class _Builder:
    """ONNX nodes and initializers, each TFLite tensor a float ONNX value; a computed int8 one also as its
    integers: int32 values (exact) or an int8 QuantizeLinear output (qdq)."""

    def __init__(self, graph: PolicyGraph, int8: Int8Form = "exact") -> None:
        import onnx

        self.onnx, self.graph, self.exact = onnx, graph, int8 == "exact"
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.float_of: dict[int, str] = {}
        self.int8_of: dict[int, str] = {}
        self.int_of: dict[int, str] = {}
        self.widened: list[str] = []  # int8 ops run in float here (exact mode): what may round otherwise
        self.count = 0

    def name(self, tag: str) -> str:
        self.count += 1
        return f"{tag}_{self.count}"

    def node(self, op: str, inputs: list[str], tag: str, **attrs: Any) -> str:
        out = self.name(tag)
        self.nodes.append(self.onnx.helper.make_node(op, inputs, [out], **attrs))
        return out

    def init(self, values: np.ndarray, tag: str) -> str:
        name = self.name(tag)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(values), name))
        return name

    def value(self, t: Tensor) -> str:
        """The float ONNX value of a TFLite tensor (dequantized where the tensor is int8)."""
        if t.index in self.float_of:
            return self.float_of[t.index]
        if t.value is not None:
            if t.quantized and t.dtype == np.int8:
                return self._dequantized_constant(t)
            self.float_of[t.index] = self.init(t.real(), f"c{t.index}")
            return self.float_of[t.index]
        if t.index in self.int_of:
            self.float_of[t.index] = onnx_integer.dequantize(self, self.int_of[t.index], t)
            return self.float_of[t.index]
        if t.index in self.int8_of:
            scale, zero = self._qparams(t)
            self.float_of[t.index] = self.node("DequantizeLinear", [self.int8_of[t.index], scale, zero], f"dq{t.index}")
            return self.float_of[t.index]
        raise UserError(f"{self.graph.label}: tensor {t.index} is read before it is computed; not translated")

    def _qparams(self, t: Tensor, per_axis: bool = False) -> tuple[str, str]:
        scales = t.scales.astype(np.float32) if per_axis and t.scales.size > 1 else np.float32(t.scales[0])
        zeros = (np.zeros(t.scales.size, np.int8) if per_axis and t.scales.size > 1
                 else np.int8(t.zero_points[0]) if t.dtype == np.int8 else np.int32(t.zero_points[0]))
        return self.init(np.asarray(scales), f"s{t.index}"), self.init(np.asarray(zeros), f"z{t.index}")

    def _dequantized_constant(self, t: Tensor) -> str:
        scale, zero = self._qparams(t, per_axis=True)
        attrs = {"axis": t.axis} if t.scales.size > 1 else {}
        raw = self.init(t.value, f"q{t.index}")
        self.float_of[t.index] = self.node("DequantizeLinear", [raw, scale, zero], f"dq{t.index}", **attrs)
        return self.float_of[t.index]

    def bias(self, b: Tensor, x: Tensor, w: Tensor) -> str:
        """A bias: int32 with scale input_scale * filter_scale (QDQ's convention), else float."""
        if b.dtype != np.int32 or not x.quantized:
            return self.value(b)
        scales = (np.float32(x.scales[0]) * w.scales.astype(np.float32)).astype(np.float32)
        raw = self.init(b.value.astype(np.int32), f"q{b.index}")
        s = self.init(scales if scales.size > 1 else np.float32(scales[0]), f"s{b.index}")
        z = self.init(np.zeros(scales.size, np.int32) if scales.size > 1 else np.int32(0), f"z{b.index}")
        return self.node("DequantizeLinear", [raw, s, z], f"dq{b.index}", **({"axis": 0} if scales.size > 1 else {}))

    def result(self, out: Tensor, value: str, activation: str = "NONE") -> None:
        """Bind a computed float value to a TFLite tensor: activation, then quantize where it is int8."""
        if activation == "RELU":
            value = self.node("Relu", [value], "relu")
        elif activation in ("RELU6", "RELU_N1_TO_1"):
            low, high = (0.0, 6.0) if activation == "RELU6" else (-1.0, 1.0)
            value = self.node("Clip", [value, self.init(np.float32(low), "lo"), self.init(np.float32(high), "hi")], "clip")
        elif activation != "NONE":
            raise UserError(f"{self.graph.label}: a fused activation ONNX export does not translate")
        if out.quantized and out.dtype == np.int8 and self.exact:
            self.int_of[out.index] = onnx_integer.quantize(self, value, out)
        elif out.quantized and out.dtype == np.int8:
            scale, zero = self._qparams(out)
            self.int8_of[out.index] = self.node("QuantizeLinear", [value, scale, zero], f"q{out.index}")
        else:
            self.float_of[out.index] = value


def _integer(b: _Builder, op: Op) -> bool:
    """Whether the exact form runs this FULLY_CONNECTED / CONV_2D as LiteRT's reference int8 kernel."""
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    if not b.exact or not (x.quantized and x.dtype == np.int8 and out.quantized and out.dtype == np.int8):
        return False
    if x.index in b.int_of and w.value is not None and w.dtype == np.int8 and not np.any(w.zero_points != 0):
        return True
    b.widened.append(op.kind)
    return False


def _widened_hybrid(b: _Builder, op: Op) -> None:
    """Record a dynamic-range op this export runs in float (hybrid_inexact says why)."""
    reason = hybrid_inexact(op) if op.hybrid else None
    if reason:
        b.widened.append(f"{op.kind} ({reason}: run in float)")


def _fc(b: _Builder, op: Op) -> None:
    _widened_hybrid(b, op)
    if is_hybrid(op):
        fc_hybrid(b, op)
        return
    if _integer(b, op):
        b.int_of[op.outputs[0].index] = onnx_integer.fc_int8(b, op, b.int_of[op.inputs[0].index])
        return
    x, w, bias = op.inputs[:3]
    flat = b.node("Flatten", [b.value(x)], "flat", axis=1)
    y = b.node("Gemm", [flat, b.value(w), *([b.bias(bias, x, w)] if bias is not None else [])], "fc", transB=1)
    b.result(op.outputs[0], y, op.activation)


def _conv(b: _Builder, op: Op) -> None:
    _widened_hybrid(b, op)
    if is_hybrid(op):
        conv_hybrid(b, op, conv_geometry(op))
        return
    if _integer(b, op):
        b.int_of[op.outputs[0].index] = onnx_integer.conv_int8(b, op, b.int_of[op.inputs[0].index])
        return
    x, w, bias = op.inputs[:3]
    stride, dilation, pads = conv_geometry(op)
    nchw = b.node("Transpose", [b.value(x)], "nchw", perm=[0, 3, 1, 2])
    kernel = b.node("Transpose", [b.value(w)], "oihw", perm=[0, 3, 1, 2])
    inputs = [nchw, kernel, *([b.bias(bias, x, w)] if bias is not None else [])]
    y = b.node("Conv", inputs, "conv", strides=list(stride), dilations=list(dilation), pads=list(pads))
    b.result(op.outputs[0], b.node("Transpose", [y], "nhwc", perm=[0, 2, 3, 1]), op.activation)


def _reshape(b: _Builder, op: Op) -> None:
    shape = b.init(np.array([-1, *op.outputs[0].shape[1:]], np.int64), "shape")
    out = op.outputs[0]
    if op.inputs[0].index in b.int_of and out.quantized:
        b.int_of[out.index] = b.node("Reshape", [b.int_of[op.inputs[0].index], shape], f"r{out.index}")
        return
    if op.inputs[0].index in b.int8_of and out.quantized:
        b.int8_of[out.index] = b.node("Reshape", [b.int8_of[op.inputs[0].index], shape], f"r{out.index}")
        return
    b.float_of[out.index] = b.node("Reshape", [b.value(op.inputs[0]), shape], f"r{out.index}")


def _elementwise(b: _Builder, op: Op) -> None:
    a, c = op.inputs[:2]
    if b.exact and op.outputs[0].dtype == np.int8:
        b.widened.append(op.kind)
    b.result(op.outputs[0], b.node(_BINARY[op.kind], [b.value(a), b.value(c)], op.kind.lower()), op.activation)


def _cast(b: _Builder, op: Op) -> None:
    b.float_of[op.outputs[0].index] = b.node("Cast", [b.value(op.inputs[0])], "cast", to=1)


def _quantize(b: _Builder, op: Op) -> None:
    if b.exact and op.inputs[0].dtype != np.float32:
        b.widened.append("QUANTIZE (requantize)")
    b.result(op.outputs[0], b.value(op.inputs[0]))


def _dequantize(b: _Builder, op: Op) -> None:
    b.float_of[op.outputs[0].index] = b.value(op.inputs[0])


def _argmax(b: _Builder, op: Op) -> None:
    x = op.inputs[0]
    values = b.int_of[x.index] if x.index in b.int_of else b.value(x)  # int8 values order as their reals do
    index = b.node("ArgMax", [values], "argmax", axis=-1, keepdims=0)  # first of equal maxima
    b.float_of[op.outputs[0].index] = b.node("Cast", [index], "action", to=6)


_TRANSLATE = {"FULLY_CONNECTED": _fc, "CONV_2D": _conv, "RESHAPE": _reshape, "SUB": _elementwise, "DIV": _elementwise,
              "MUL": _elementwise, "ADD": _elementwise, "CAST": _cast, "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize,
              "ARG_MAX": _argmax}



@dataclass
class _Translation:
    """A ModelProto and the int8 ops the exact form ran in float (none for compress-dqn's own policies)."""

    model: Any
    widened: list[str]


def _translate(graph: PolicyGraph, int8: Int8Form) -> _Translation:
    import onnx

    if int8 not in INT8_FORMS:
        raise UserError(f"--onnx-int8 {int8}: choose one of {', '.join(INT8_FORMS)}")
    b = _Builder(graph, int8)
    obs = graph.observation
    raw_type = np.float32 if obs.quantized else obs.dtype.type
    b.float_of[obs.index] = "observations"
    if obs.quantized:  # an int8-input policy: its caller's normalization and quantization, inside
        _int8_input(b, graph)
    for op in graph.ops:
        _TRANSLATE[op.kind](b, op)
    outputs = []
    for name in ("action", "q_values"):
        if name not in graph.outputs:
            continue
        value = b.value(graph.outputs[name])
        b.nodes.append(onnx.helper.make_node("Identity", [value], [name]))
        elem = onnx.TensorProto.INT32 if name == "action" else onnx.TensorProto.FLOAT
        shape = ["batch"] if name == "action" else ["batch", graph.n_actions]
        outputs.append(onnx.helper.make_tensor_value_info(name, elem, shape))
    inputs = [onnx.helper.make_tensor_value_info("observations", onnx.helper.np_dtype_to_tensor_dtype(np.dtype(raw_type)),
                                                 ["batch", *obs.shape[1:]])]
    model = onnx.helper.make_model(onnx.helper.make_graph(b.nodes, "policy", inputs, outputs, b.inits),
                                   opset_imports=[onnx.helper.make_opsetid("", OPSET)], producer_name="compress-dqn")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return _Translation(model, b.widened)


def _int8_input(b: _Builder, graph: PolicyGraph) -> None:
    obs, x = graph.observation, "observations"
    if graph.caller_normalization is not None:
        mean, std = graph.caller_normalization.mean, graph.caller_normalization.std
        x = b.node("Div", [b.node("Sub", [x, b.init(mean.astype(np.float32), "mean")], "sub"),
                           b.init(std.astype(np.float32), "std")], "div")
    x = b.node("Reshape", [x, b.init(np.array([-1, *obs.shape[1:]], np.int64), "shape")], "obs")
    del b.float_of[obs.index]
    if b.exact:
        b.int_of[obs.index] = onnx_integer.caller_quantize(b, x, obs)
        return
    scale, zero = b._qparams(obs)
    b.int8_of[obs.index] = b.node("QuantizeLinear", [x, scale, zero], f"q{obs.index}")


def default_file(policy: Path) -> Path:
    """NAME.onnx in the current directory (NAME: policy_name)."""
    return Path(f"{policy_name(policy)}.onnx")


class OnnxExport(ExportReport):
    """What `export --target onnx` wrote: the file, its int8 form, and the int8 ops it runs in float."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"widened"})
    policy: str
    out: str
    bytes: int
    quantized: str
    opset: int
    input: str
    outputs: list[str]
    widened: list[str] | None = None
    """Ops of the int8 graph the exact form computes in float (not reproduced bit for bit); absent when none."""


def export(policy: Path, out: Path | None = None, options: ExportOptions = ExportOptions()) -> OnnxExport:
    """`export --target onnx`: write the ONNX model of a .tflite policy to `out` (default ./NAME.onnx) in the int8
    form options.onnx_int8 asks for (exact by default); returns what was written."""
    from compress_dqn.fileio import write_bytes_atomic

    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError("--target onnx needs the onnx package: pip install 'compress-dqn[onnx]'") from None
    int8: Int8Form = options.onnx_int8 or "exact"
    policy = Path(policy)
    out = Path(out) if out is not None else default_file(policy)
    graph = read_policy_graph(policy, ("action", "q_values"))
    translation = _translate(graph, int8)
    data = translation.model.SerializeToString()
    write_bytes_atomic(out, data)
    integer = any(t.dtype == np.int8 and t.quantized for op in graph.ops for t in op.outputs)
    kind = ("int8 (LiteRT's reference kernels in integer ops)" if integer and int8 == "exact" else "QDQ int8" if integer
            else "hybrid int8 (LiteRT's dynamic range)" if any(is_hybrid(op) for op in graph.ops) else "fp32")
    return OnnxExport(policy=str(policy), out=str(out), bytes=len(data), quantized=kind, opset=OPSET,
                      input="observations", outputs=["action", "q_values"],
                      widened=sorted(set(translation.widened)) or None)
