"""`export --target onnx`: a .tflite policy as ONNX for onnxruntime (and Unity, Godot, TensorRT, OpenVINO).

An int8 file becomes QDQ ONNX (int8 weights and activations as QuantizeLinear/DequantizeLinear
pairs around float ops, which onnxruntime fuses into its integer kernels); a float file (fp32,
float16) becomes fp32 ONNX, its weights widened; a dynamic-range file's hybrid layers repeat LiteRT's
hybrid arithmetic in standard ops (onnx_hybrid.py: the input quantized per row, integer products,
float scales), so they compute its values bit for bit. The model takes raw observations
(`observations`, the environment's dtype and layout: the normalization is inside, an int8-input
policy's too) and gives `action` (int32, the policy) and `q_values` (float), whose argmax is the
action wherever the .tflite's is. onnxruntime rounds its own way (ties to even where TFLite rounds
ties away, its own requantization), so an int8 ONNX policy can differ from the .tflite on states at a
rounding boundary; float layers compute the same functions, summed in onnxruntime's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.deploy.onnx_hybrid import conv_hybrid, fc_hybrid, is_hybrid
from compress_dqn.deploy.tflite_graph import Op, PolicyGraph, Tensor, read_policy_graph
from compress_dqn.errors import UserError

OPSET = 17
_BINARY = {"SUB": "Sub", "DIV": "Div", "MUL": "Mul", "ADD": "Add"}


class _Builder:
    """ONNX nodes and initializers, each TFLite tensor a float ONNX value (an int8 one also as int8)."""

    def __init__(self, graph: PolicyGraph) -> None:
        import onnx

        self.onnx, self.graph = onnx, graph
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.float_of: dict[int, str] = {}
        self.int8_of: dict[int, str] = {}
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
        if out.quantized and out.dtype == np.int8:
            scale, zero = self._qparams(out)
            self.int8_of[out.index] = self.node("QuantizeLinear", [value, scale, zero], f"q{out.index}")
        else:
            self.float_of[out.index] = value


def _fc(b: _Builder, op: Op) -> None:
    if is_hybrid(op):
        fc_hybrid(b, op)
        return
    x, w, bias = op.inputs[:3]
    flat = b.node("Flatten", [b.value(x)], "flat", axis=1)
    y = b.node("Gemm", [flat, b.value(w), *([b.bias(bias, x, w)] if bias is not None else [])], "fc", transB=1)
    b.result(op.outputs[0], y, op.activation)


def _conv(b: _Builder, op: Op) -> None:
    from compress_dqn.deploy.c_export import conv_geometry

    if is_hybrid(op):
        conv_hybrid(b, op, conv_geometry(op))
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
    if op.inputs[0].index in b.int8_of and out.quantized:
        b.int8_of[out.index] = b.node("Reshape", [b.int8_of[op.inputs[0].index], shape], f"r{out.index}")
        return
    b.float_of[out.index] = b.node("Reshape", [b.value(op.inputs[0]), shape], f"r{out.index}")


def _elementwise(b: _Builder, op: Op) -> None:
    a, c = op.inputs[:2]
    b.result(op.outputs[0], b.node(_BINARY[op.kind], [b.value(a), b.value(c)], op.kind.lower()), op.activation)


def _cast(b: _Builder, op: Op) -> None:
    b.float_of[op.outputs[0].index] = b.node("Cast", [b.value(op.inputs[0])], "cast", to=1)


def _quantize(b: _Builder, op: Op) -> None:
    b.result(op.outputs[0], b.value(op.inputs[0]))


def _dequantize(b: _Builder, op: Op) -> None:
    b.float_of[op.outputs[0].index] = b.value(op.inputs[0])


def _argmax(b: _Builder, op: Op) -> None:
    index = b.node("ArgMax", [b.value(op.inputs[0])], "argmax", axis=-1, keepdims=0)  # first of equal maxima
    b.float_of[op.outputs[0].index] = b.node("Cast", [index], "action", to=6)


_TRANSLATE = {"FULLY_CONNECTED": _fc, "CONV_2D": _conv, "RESHAPE": _reshape, "SUB": _elementwise, "DIV": _elementwise,
              "MUL": _elementwise, "ADD": _elementwise, "CAST": _cast, "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize,
              "ARG_MAX": _argmax}


def to_onnx(source: Any) -> Any:
    """The ONNX ModelProto of a .tflite policy (path or bytes)."""
    import onnx

    graph = read_policy_graph(source, ("action", "q_values"))
    b = _Builder(graph)
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
    return model


def _int8_input(b: _Builder, graph: PolicyGraph) -> None:
    obs, x = graph.observation, "observations"
    if graph.caller_normalization is not None:
        mean, std = graph.caller_normalization
        x = b.node("Div", [b.node("Sub", [x, b.init(mean.astype(np.float32), "mean")], "sub"),
                           b.init(std.astype(np.float32), "std")], "div")
    x = b.node("Reshape", [x, b.init(np.array([-1, *obs.shape[1:]], np.int64), "shape")], "obs")
    scale, zero = b._qparams(obs)
    b.int8_of[obs.index] = b.node("QuantizeLinear", [x, scale, zero], f"q{obs.index}")
    del b.float_of[obs.index]


def default_file(policy: Path) -> Path:
    """runs/X/variants/NAME/policy.tflite -> NAME.onnx in the current directory, else the file's stem."""
    policy = Path(policy)
    return Path(f"{policy.parent.name}.onnx" if policy.stem == "policy" and policy.parent.name else f"{policy.stem}.onnx")


def export_onnx_file(policy: Path, out: Path | None = None) -> dict[str, Any]:
    """Write the ONNX model of a .tflite policy; returns what was written."""
    from compress_dqn.fileio import write_bytes_atomic

    try:
        import onnx  # noqa: F401
    except ImportError:
        raise UserError("--target onnx needs the onnx package: pip install 'compress-dqn[onnx]'") from None
    policy = Path(policy)
    out = Path(out) if out is not None else default_file(policy)
    model = to_onnx(policy)
    data = model.SerializeToString()
    write_bytes_atomic(out, data)
    graph = read_policy_graph(policy)
    kind = "QDQ int8" if graph.integer else "hybrid int8 (LiteRT's dynamic range)" if any(is_hybrid(op) for op in graph.ops) else "fp32"
    return {"policy": str(policy), "out": str(out), "bytes": len(data), "quantized": kind,
            "opset": OPSET, "input": "observations", "outputs": ["action", "q_values"]}
