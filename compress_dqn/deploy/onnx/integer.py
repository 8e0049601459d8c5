"""LiteRT's reference int8 kernels in standard ONNX integer ops, so an int8 policy acts alike on every CPU.

QDQ ONNX (QuantizeLinear/DequantizeLinear around float ops) leaves the arithmetic to whichever fused
kernels onnxruntime picks for the CPU: its s8s8 products and float requantization gave 45 of 1,000
actions other than LiteRT's reference kernels on an AVX2 CPU and 0 on an AVX-512 VNNI one. Here each
int8 tensor is an int32 ONNX value holding its int8 integers, and each op repeats c/runtime.py's
arithmetic (the C export's, checked against BUILTIN_REF) in ops whose results are defined exactly:
- products: MatMulInteger / ConvInteger of x + 128 and w + 128 (uint8 x uint8: exact on every x86
  kernel, hybrid.py says why), less (x_zero + 128) times the weights' sum over the taps inside
  the image; then the int32 bias;
- FULLY_CONNECTED's requantization: round((double)acc * M), M = input * filter / output scale in
  double, one IEEE double product, rounded half away from zero (trunc, then +-1: never ONNX's Round);
- CONV_2D's: gemmlowp's MultiplyByQuantizedMultiplier in int64 (the doubling high product with its
  nudge, divided as magnitudes, then the rounding right shift as a floor and a remainder);
- QUANTIZE: roundf(x / scale) + zero point in float, clamped; DEQUANTIZE: (float)(q - zero) * scale.
"""

from __future__ import annotations

import numpy as np

from compress_dqn.deploy.onnx.hybrid import (
    BOUND,
    F32,
    F64,
    I32,
    I64,
    GraphBuilder,
    constant,
    inside_sums,
    round_away,
    shifted_input,
    shifted_weights,
)
from compress_dqn.deploy.tflite.graph import (
    Op,
    Tensor,
    conv_geometry,
    double_multiplier,
    int8_bounds,
    quantize_multiplier,
)

def quantize(b: GraphBuilder, value: str, out: Tensor) -> str:
    """LiteRT's QUANTIZE (float -> int8): roundf(x / scale) + zero point, clamped; as int32 values."""
    v = b.node("Div", [value, constant(b, out.scales[0], np.float32, f"s{out.index}")], "scaled")
    v = b.node("Clip", [v, constant(b, -BOUND, np.float32), constant(b, BOUND, np.float32)], "bounded")
    q = b.node("Add", [round_away(b, v, F32), constant(b, int(out.zero_points[0]), np.int32)], "offset")
    return b.node("Clip", [q, constant(b, -128, np.int32), constant(b, 127, np.int32)], f"q{out.index}")


def caller_quantize(b: GraphBuilder, value: str, obs: Tensor) -> str:
    """An int8-input policy's caller quantization, as compress-dqn's loader does it: round(x / scale + zero)
    in float32, ties to even (numpy's round, ONNX's Round)."""
    v = b.node("Div", [value, constant(b, obs.scales[0], np.float32, f"s{obs.index}")], "scaled")
    v = b.node("Add", [v, constant(b, float(obs.zero_points[0]), np.float32)], "offset")
    v = b.node("Clip", [b.node("Round", [v], "rounded"), constant(b, -128.0, np.float32), constant(b, 127.0, np.float32)], "clamped")
    return b.node("Cast", [v], f"q{obs.index}", to=I32)


def dequantize(b: GraphBuilder, q: str, t: Tensor) -> str:
    """DEQUANTIZE: (float)(q - zero point) * scale."""
    centered = b.node("Sub", [q, constant(b, int(t.zero_points[0]), np.int32)], "centered")
    return b.node("Mul", [b.node("Cast", [centered], "centeredf", to=F32), constant(b, t.scales[0], np.float32)], "dq")


def _clamped(b: GraphBuilder, q: str, out: Tensor, activation: str) -> str:
    """q + the output's zero point, clamped to the activation's int8 range (CalculateActivationRangeQuantized)."""
    lo, hi = int8_bounds(out, activation)
    q = b.node("Add", [q, constant(b, int(out.zero_points[0]), np.int32)], "offset")
    return b.node("Clip", [q, constant(b, lo, np.int32), constant(b, hi, np.int32)], f"q{out.index}")


def _less_zero(b: GraphBuilder, product: str, x: Tensor, sums: np.ndarray, tag: str) -> str:
    """sum (x + 128) w - (x_zero + 128) sum w = sum (x - x_zero) w, exact in int32."""
    offset = (sums.astype(np.int64) * (int(x.zero_points[0]) + 128)).astype(np.int32)
    return b.node("Sub", [product, b.init(offset, tag)], "less_zero")


def _with_bias(b: GraphBuilder, acc: str, bias: Tensor | None, shape: tuple[int, ...]) -> str:
    if bias is None:
        return acc
    return b.node("Add", [acc, b.init(bias.value.astype(np.int32).reshape(shape), f"b{bias.index}")], "biased")


def fc_int8(b: GraphBuilder, op: Op, q: str) -> str:
    """reference_integer_ops::FullyConnected with its double multiplier; q: the input's int8 values."""
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    out = op.outputs[0]
    flat = b.node("Reshape", [q, b.init(np.array([-1, w.shape[1]], np.int64), "shape")], "flat")
    dot = b.node("MatMulInteger", [shifted_input(b, flat), b.init(shifted_weights(w.value.T), f"w{w.index}"), "",
                                   constant(b, 128, np.uint8, "z128")], "dot")
    acc = _with_bias(b, _less_zero(b, dot, x, w.value.astype(np.int64).sum(axis=1), f"zs{w.index}"), bias, (-1,))
    scales = np.broadcast_to(w.scales, (w.shape[0],))
    multiplier = np.array([m * 2.0 ** -s for m, s in (double_multiplier(x.scales[0], fs, out.scales[0]) for fs in scales)])
    v = b.node("Mul", [b.node("Cast", [acc], "accd", to=F64), b.init(multiplier, f"m{out.index}")], "scaled")
    v = b.node("Clip", [v, constant(b, -BOUND, np.float64), constant(b, BOUND, np.float64)], "bounded")
    return _clamped(b, round_away(b, v, F64), out, op.activation)


def conv_int8(b: GraphBuilder, op: Op, q: str) -> str:
    """reference_integer_ops::ConvPerChannel; q: the input's int8 values, NHWC. Padding adds nothing."""
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    out = op.outputs[0]
    _, ih, iw, _ = x.shape
    _, oh, ow, oc = out.shape
    geometry = conv_geometry(op)
    (stride, dilation, pads) = geometry
    image = b.node("Transpose", [shifted_input(b, q)], "q_nchw", perm=[0, 3, 1, 2])
    if any(pads):  # padded with x + 128 = 0: a tap outside adds nothing to the product, nor to the zero's share
        top, left, bottom, right = pads
        image = b.node("Pad", [image, b.init(np.array([0, 0, top, left, 0, 0, bottom, right], np.int64), "pads")],
                       "q_padded")
    acc = b.node("ConvInteger", [image, b.init(shifted_weights(w.value.transpose(0, 3, 1, 2)), f"w{w.index}"), "",
                                 constant(b, 128, np.uint8, "z128")], "acc", strides=list(stride), dilations=list(dilation))
    acc = _less_zero(b, acc, x, inside_sums(w.value, geometry, (oh, ow), (ih, iw)), f"zs{w.index}")
    acc = _with_bias(b, acc, bias, (1, oc, 1, 1))
    scales = np.broadcast_to(w.scales, (oc,))
    mult, shift = (np.array(v, np.int64) for v in zip(*(
        quantize_multiplier(float(np.float32(x.scales[0])) * float(fs) / float(np.float32(out.scales[0]))) for fs in scales)))
    y = _multiply_by_quantized_multiplier(b, acc, mult.reshape(1, oc, 1, 1), shift.reshape(1, oc, 1, 1))
    return b.node("Transpose", [_clamped(b, y, out, op.activation)], "nhwc", perm=[0, 2, 3, 1])


def _multiply_by_quantized_multiplier(b: GraphBuilder, acc: str, mult: np.ndarray, shift: np.ndarray) -> str:
    """TFLite's MultiplyByQuantizedMultiplier of int32 values, in int64; returns int32 values."""
    a = b.node("Cast", [acc], "acc64", to=I64)
    left = np.maximum(shift, 0)
    if np.any(left):  # x * 2^left wraps in int32 as the kernel's shift does
        a = b.node("Mul", [a, b.init((1 << left).astype(np.int64), "pot")], "shifted")
        a = b.node("Mod", [b.node("Add", [a, constant(b, 1 << 31, np.int64)], "biased"), constant(b, 1 << 32, np.int64)], "wrapped")
        a = b.node("Sub", [a, constant(b, 1 << 31, np.int64)], "wrapped")
    ab = b.node("Mul", [a, b.init(mult, "mult")], "ab")
    nudge = b.node("Where", [b.node("GreaterOrEqual", [ab, constant(b, 0, np.int64)], "nonneg"),
                             constant(b, 1 << 30, np.int64), constant(b, 1 - (1 << 30), np.int64)], "nudge")
    v = b.node("Add", [ab, nudge], "nudged")
    # SaturatingRoundingDoublingHighMul: v / 2^31 truncated toward zero, divided as magnitudes
    magnitude = b.node("Div", [b.node("Abs", [v], "abs"), constant(b, 1 << 31, np.int64)], "high_abs")
    high = b.node("Mul", [b.node("Sign", [v], "sign"), magnitude], "high")
    right = np.maximum(-shift, 0)
    if np.any(right):  # RoundingDivideByPOT: floor(high / 2^right) + (remainder > threshold)
        pot = (1 << right).astype(np.int64)
        rem = b.node("Mod", [high, b.init(pot, "pot")], "rem")  # in [0, 2^right): high & mask
        floor = b.node("Div", [b.node("Sub", [high, rem], "exact"), b.init(pot, "pot")], "floor")
        negative = b.node("Cast", [b.node("Less", [high, constant(b, 0, np.int64)], "neg")], "negative", to=I64)
        threshold = b.node("Add", [b.init((pot - 1) >> 1, "half_mask"), negative], "threshold")
        up = b.node("Cast", [b.node("Greater", [rem, threshold], "over")], "up", to=I64)
        high = b.node("Add", [floor, up], "rounded")
    return b.node("Cast", [high], "y", to=I32)
