"""LiteRT's hybrid (dynamic-range) FULLY_CONNECTED and CONV_2D in standard ONNX ops, operation for operation.

A dynamic-range file's hybrid ops quantize their float input on every call, multiply in integers
and scale back in float; widening the int8 weights and running in float plays another policy. So
each op here repeats the arithmetic of c/hybrid.py (LiteRT's x86-64 kernels), per batch row:
- the range (ReduceMin/ReduceMax per row; asymmetric: capped at zero, its float width widened to
  double for the scale, the zero point's choice and its round-half-away in double; symmetric:
  range / 127 and 127 / range in float), `1 / factor` as a float Div;
- the rounding: the first n & ~7 values as v + 0.5 (v - 0.5 below zero) in float, truncated (Cast
  to int32 truncates), the rest as roundf (trunc, then +-1 where the remainder reaches a half),
  picked by a constant mask; ONNX's own Round (ties to even) is never used; then the clamp;
- the product in integers: MatMulInteger / ConvInteger of q + 128 and w + 128 (uint8, the weights'
  zero point 128: onnxruntime's uint8 x uint8 x86 kernels widen to 16 bits before multiplying,
  where its uint8 x int8 ones without VNNI add pairs in int16, saturating), less (zero point + 128)
  times the row sum (conv: the sum over the taps inside the image, the image padded with zeros);
- the float out: (float)dot times (filter scale * input scale), plus the bias, in the C's order.
An op this module does not repeat (sparse weights, which LiteRT runs with another kernel, or weights
not symmetric per output channel or per tensor) is widened as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from compress_dqn.deploy.tflite.graph import Op, Tensor, hybrid_inexact

F32, F64, I32, I64, U8 = 1, 11, 6, 7, 2  # onnx.TensorProto element types, for the integer form too
BOUND = 1024.0  # |v * inverse| (or any value in int8 steps) past this saturates int8 either way; bounding it keeps the int32 Casts defined


class GraphBuilder(Protocol):
    """What onnx/export.py's builder offers: nodes, constants, a tensor's float value, a bound result."""

    def node(self, op: str, inputs: list[str], tag: str, **attrs: Any) -> str: ...
    def init(self, values: np.ndarray, tag: str) -> str: ...
    def value(self, t: Tensor) -> str: ...
    def result(self, out: Tensor, value: str, activation: str = "NONE") -> None: ...


@dataclass
class _Quantized:
    """A hybrid op's input quantized per row: q + 128 as uint8, the zero point (int32, asymmetric only),
    the scaling factor (float) and whether the row is all zeros (each [batch, 1])."""

    shifted: str
    zero: str | None
    factor: str
    empty: str


def is_hybrid(op: Op) -> bool:
    """Whether LiteRT runs this op with its hybrid kernels and this module repeats them (hybrid_inexact's rule)."""
    return op.hybrid and hybrid_inexact(op) is None


def constant(b: GraphBuilder, value: object, dtype: type, tag: str = "k") -> str:
    """A constant initializer of the given numpy dtype."""
    return b.init(np.asarray(value, dtype), tag)


def _asymmetric(b: GraphBuilder, low: str, high: str) -> tuple[str, str, str, str]:
    """NeonAsymmetricQuantizeFloats' parameters: (factor, inverse, zero point, empty)."""
    lo = b.node("Min", [low, constant(b, 0.0, np.float32)], "lo")  # the range always holds zero
    hi = b.node("Max", [high, constant(b, 0.0, np.float32)], "hi")
    width = b.node("Sub", [hi, lo], "width")  # in float, then widened, as LiteRT's NEON code
    empty = b.node("Equal", [width, constant(b, 0.0, np.float32)], "empty")
    wide = b.node("Where", [empty, constant(b, 255.0, np.float64), b.node("Cast", [width], "wide", to=F64)], "wide")
    scale = b.node("Div", [wide, constant(b, 255.0, np.float64)], "scale")  # 1.0 for an all-zero row, as LiteRT's
    lo_steps = b.node("Div", [b.node("Cast", [lo], "lod", to=F64), scale], "lo_steps")
    hi_steps = b.node("Div", [b.node("Cast", [hi], "hid", to=F64), scale], "hi_steps")
    from_min = b.node("Sub", [constant(b, -128.0, np.float64), lo_steps], "from_min")
    from_max = b.node("Sub", [constant(b, 127.0, np.float64), hi_steps], "from_max")
    error_min = b.node("Add", [constant(b, 128.0, np.float64), b.node("Abs", [lo_steps], "abs")], "error_min")
    error_max = b.node("Add", [constant(b, 127.0, np.float64), b.node("Abs", [hi_steps], "abs")], "error_max")
    zero = b.node("Where", [b.node("Less", [error_min, error_max], "nearer"), from_min, from_max], "zero")
    zero = b.node("Clip", [zero, constant(b, -128.0, np.float64), constant(b, 127.0, np.float64)], "zero")
    zero = b.node("Where", [empty, constant(b, 0, np.int32), round_away(b, zero, F64)], "zero_point")
    factor = b.node("Cast", [scale], "factor", to=F32)
    inverse = b.node("Div", [constant(b, 1.0, np.float32), factor], "inverse")
    inverse = b.node("Where", [b.node("Equal", [factor, constant(b, 0.0, np.float32)], "underflow"),
                               constant(b, 0.0, np.float32), inverse], "inverse")
    return factor, inverse, zero, empty


def _symmetric(b: GraphBuilder, low: str, high: str) -> tuple[str, str, str]:
    """NeonSymmetricQuantizeFloats' parameters: (factor, inverse, empty); an all-zero row gets factor 1."""
    top = b.node("Max", [b.node("Abs", [low], "abs"), b.node("Abs", [high], "abs")], "range")
    empty = b.node("Equal", [top, constant(b, 0.0, np.float32)], "empty")
    top = b.node("Where", [empty, constant(b, 127.0, np.float32), top], "range")
    factor = b.node("Div", [top, constant(b, 127.0, np.float32)], "factor")
    return factor, b.node("Div", [constant(b, 127.0, np.float32), top], "inverse"), empty


def round_away(b: GraphBuilder, v: str, elem: int) -> str:
    """round(v), ties away from zero, as int32: trunc(v) (a Cast), then +-1 where v - trunc(v) reaches a half
    (that difference is exact)."""
    dtype = np.float64 if elem == F64 else np.float32
    t = b.node("Cast", [v], "trunc", to=I32)
    d = b.node("Sub", [v, b.node("Cast", [t], "truncf", to=elem)], "frac")
    up = b.node("Cast", [b.node("GreaterOrEqual", [d, constant(b, 0.5, dtype)], "ge")], "up", to=I32)
    down = b.node("Cast", [b.node("LessOrEqual", [d, constant(b, -0.5, dtype)], "le")], "down", to=I32)
    return b.node("Sub", [b.node("Add", [t, up], "add"), down], "rounded")


def _round(b: GraphBuilder, p: str, n: int) -> str:
    """LiteRT's x86 rounding of v * inverse: the first n & ~7 values (its loop of 8, NEON_2_SSE's vcvtq of
    v +- 0.5) truncated after adding a half in float, the rest (its scalar tail) as roundf."""
    p = b.node("Clip", [p, constant(b, -BOUND, np.float32), constant(b, BOUND, np.float32)], "bounded")
    split = n & ~7
    half = None
    if split:
        sign = b.node("Where", [b.node("Less", [p, constant(b, 0.0, np.float32)], "neg"), constant(b, -0.5, np.float32),
                                constant(b, 0.5, np.float32)], "half")
        half = b.node("Cast", [b.node("Add", [p, sign], "plus_half")], "half_trunc", to=I32)
        if split == n:
            return half
    tail = round_away(b, p, F32)
    if half is None:
        return tail
    return b.node("Where", [b.init(np.arange(n) < split, "vector_part"), half, tail], "round")


def quantize_rows(b: GraphBuilder, flat: str, n: int, asymmetric: bool) -> _Quantized:
    """A [batch, n] float value quantized per row as LiteRT's hybrid kernels do."""
    low = b.node("ReduceMin", [flat], "min", axes=[1], keepdims=1)
    high = b.node("ReduceMax", [flat], "max", axes=[1], keepdims=1)
    zero = None
    if asymmetric:
        factor, inverse, zero, empty = _asymmetric(b, low, high)
    else:
        factor, inverse, empty = _symmetric(b, low, high)
    q = _round(b, b.node("Mul", [flat, inverse], "scaled"), n)
    if zero is not None:
        q = b.node("Add", [q, zero], "offset")
    q = b.node("Clip", [q, constant(b, -128 if asymmetric else -127, np.int32), constant(b, 127, np.int32)], "q")
    return _Quantized(shifted_input(b, q), zero, factor, empty)


def shifted_input(b: GraphBuilder, q: str) -> str:
    """int8 values (as int32) + 128, as uint8: the uint8 x uint8 products' input."""
    return b.node("Cast", [b.node("Add", [q, constant(b, 128, np.int32)], "q128")], "q_u8", to=U8)


def shifted_weights(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.int16) + 128).astype(np.uint8)


def _less_offset(b: GraphBuilder, product: str, zero: str | None, sums: np.ndarray, tag: str) -> str:
    """w . (q + 128) - (zero_point + 128) * sum(w) = w . (q - zero_point), exact in int32. The Sub also keeps
    onnxruntime from fusing MatMulInteger -> Cast -> Mul into MatMulIntegerToFloat, which reads one
    input scale, not one a row."""
    if zero is None:
        return b.node("Sub", [product, b.init((sums.astype(np.int64) * 128).astype(np.int32), tag)], "less_offset")
    shifted = b.node("Add", [zero, constant(b, 128, np.int32)], "zero128")
    return b.node("Sub", [product, b.node("Mul", [shifted, b.init(sums, tag)], "offset")], "less_offset")


def fc_hybrid(b: GraphBuilder, op: Op) -> None:
    """EvalHybridDense: bias + (float)(w . q - rowsum(w) * zero_point) * (filter_scale * input_scale), then the
    activation; an all-zero row gives the bias, as LiteRT skips its product."""
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    n_out, n_in = w.shape
    asymmetric = bool(op.options.get("asymmetricQuantizeInputs", False))
    q = quantize_rows(b, b.node("Flatten", [b.value(x)], "flat", axis=1), n_in, asymmetric)
    weights = b.init(shifted_weights(w.value.T), f"w{w.index}")
    dot = b.node("MatMulInteger", [q.shifted, weights, "", constant(b, 128, np.uint8, "z128")], "dot")  # w . (q + 128)
    dot = _less_offset(b, dot, q.zero, w.value.astype(np.int32).sum(axis=1, dtype=np.int32), f"rowsum{w.index}")
    if w.scales.size > 1:
        scale = b.node("Mul", [b.init(w.scales.astype(np.float32), f"ws{w.index}"), q.factor], "scale")
    else:
        scale = b.node("Mul", [q.factor, constant(b, w.scales[0], np.float32, f"ws{w.index}")], "scale")
    product = b.node("Mul", [b.node("Cast", [dot], "dotf", to=F32), scale], "product")
    base = b.init(bias.real() if bias is not None else np.zeros(n_out, np.float32), "bias")
    y = b.node("Where", [q.empty, base, b.node("Add", [base, product], "biased")], "fc")
    b.result(op.outputs[0], y, op.activation)


def inside_sums(w: np.ndarray, geometry: tuple, out_hw: tuple[int, int], in_hw: tuple[int, int]) -> np.ndarray:
    """[channel, oy, ox]: the sum of a channel's weights over the taps that fall inside the image."""
    (sh, sw), (dh, dw), (top, left, _, _) = geometry
    taps = w.astype(np.int64).sum(axis=-1)  # [oc, kh, kw]
    rows = np.arange(out_hw[0])[:, None] * sh - top + dh * np.arange(taps.shape[1])[None]  # [oy, fy]: the image row
    cols = np.arange(out_hw[1])[:, None] * sw - left + dw * np.arange(taps.shape[2])[None]
    inside_y = ((rows >= 0) & (rows < in_hw[0])).astype(np.int64)
    inside_x = ((cols >= 0) & (cols < in_hw[1])).astype(np.int64)
    return np.einsum("ofx,yf,zx->oyz", taps, inside_y, inside_x).astype(np.int32)


def conv_hybrid(b: GraphBuilder, op: Op, geometry: tuple) -> None:
    """LiteRT's hybrid CONV_2D: per channel (asymmetric input) (float)acc * channel_scale * input_scale +
    bias; one scale for every channel (symmetric) (float)acc * (input_scale * filter_scale) + bias;
    padding adds nothing (the image padded with q = 0, the zero point's share over the inside taps only)."""
    x, w = op.inputs[:2]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    _, ih, iw, ic = x.shape
    _, oh, ow, oc = op.outputs[0].shape
    stride, dilation, pads = geometry
    per_channel = bool(np.any(w.scales != w.scales[0]))  # LiteRT's per-channel kernel, else its one-scale one
    q = quantize_rows(b, b.node("Flatten", [b.value(x)], "flat", axis=1), ih * iw * ic, per_channel)
    image = b.node("Reshape", [q.shifted, b.init(np.array([-1, ih, iw, ic], np.int64), "shape")], "q_image")
    image = b.node("Transpose", [image], "q_nchw", perm=[0, 3, 1, 2])
    if any(pads):  # padded with q + 128 = 0: the taps outside add nothing
        top, left, bottom, right = pads
        image = b.node("Pad", [image, b.init(np.array([0, 0, top, left, 0, 0, bottom, right], np.int64), "pads")],
                       "q_padded")
    kernel = b.init(shifted_weights(w.value.transpose(0, 3, 1, 2)), f"w{w.index}")
    acc = b.node("ConvInteger", [image, kernel, "", constant(b, 128, np.uint8, "z128")], "acc", strides=list(stride),
                 dilations=list(dilation))
    inside = inside_sums(w.value, geometry, (oh, ow), (ih, iw))
    zero = None if q.zero is None else b.node("Reshape", [q.zero, b.init(np.array([-1, 1, 1, 1], np.int64), "shape")], "zero4")
    acc = _less_offset(b, acc, zero, inside, f"inside{w.index}")
    v = b.node("Cast", [acc], "accf", to=F32)
    factor = b.node("Reshape", [q.factor, b.init(np.array([-1, 1, 1, 1], np.int64), "shape")], "factor4")
    if per_channel:
        v = b.node("Mul", [v, b.init(w.scales.astype(np.float32).reshape(1, oc, 1, 1), f"ws{w.index}")], "scaled")
        v = b.node("Mul", [v, factor], "scaled")
    else:
        v = b.node("Mul", [v, b.node("Mul", [factor, constant(b, w.scales[0], np.float32, f"ws{w.index}")], "scale")], "scaled")
    if bias is not None:
        v = b.node("Add", [v, b.init(bias.real().reshape(1, oc, 1, 1), "bias")], "biased")
    b.result(op.outputs[0], b.node("Transpose", [v], "nhwc", perm=[0, 2, 3, 1]), op.activation)
