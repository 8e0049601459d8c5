"""A policy's .tflite graph read without a runtime: the ops that compute its `action`, with their constants.

The C and ONNX exporters (c/source.py, onnx/export.py) translate this, not the flatbuffer: one
reader decides which ops a policy holds and refuses, by name, those neither can translate.
Constants come out as numpy arrays; float16 constants behind a DEQUANTIZE are widened here
(exactly, as LiteRT does at run time), so no exporter sees that op, and INT4 weights (two a byte)
come out as int8 arrays of the same values (Tensor.int4 says so: the C export packs them two a byte again).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.reader import SIGNATURE, builtin, decode, litert_schema, op_names, read_tflite
from compress_dqn.deploy.tflite.metadata import caller_normalization
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError

_DTYPES = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT8": np.int8, "UINT8": np.uint8, "INT32": np.int32,
           "INT64": np.int64, "INT16": np.int16, "BOOL": np.bool_}
ACTIVATIONS = {0: "NONE", 1: "RELU", 2: "RELU_N1_TO_1", 3: "RELU6"}
SUPPORTED = {"FULLY_CONNECTED", "CONV_2D", "RESHAPE", "ARG_MAX", "QUANTIZE", "DEQUANTIZE", "CAST",
             "SUB", "DIV", "MUL", "ADD", "DENSIFY"}


@dataclass
class Tensor:
    """One tensor: its shape (batch 1), dtype, quantization (scales, zero points, axis) and constant value."""

    index: int
    shape: tuple[int, ...]
    dtype: np.dtype
    scales: np.ndarray | None = None
    zero_points: np.ndarray | None = None
    axis: int = 0
    value: np.ndarray | None = None
    sparse: bool = False  # stored in sparse format: LiteRT runs other kernels on it
    int4: bool = False  # stored as INT4, two a byte: value holds them unpacked (the C export packs them again)

    @property
    def quantized(self) -> bool:
        return self.scales is not None and self.dtype.kind in "iu"

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    def real(self) -> np.ndarray:
        """A constant's real values (dequantized where it is quantized)."""
        if not self.quantized:
            return self.value.astype(np.float32)
        shape = [1] * self.value.ndim
        if self.scales.size > 1:
            shape[self.axis] = -1
        scale, zero = self.scales.reshape(shape), self.zero_points.reshape(shape)
        return ((self.value.astype(np.float32) - zero.astype(np.float32)) * scale).astype(np.float32)


@dataclass
class Op:
    """One operator: its builtin name, input and output tensors, and its options as a dict."""

    kind: str
    inputs: list[Tensor | None]
    outputs: list[Tensor]
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def activation(self) -> str:
        return ACTIVATIONS.get(int(self.options.get("fusedActivationFunction", 0)), "UNSUPPORTED")

    @property
    def hybrid(self) -> bool:
        """A dynamic-range layer: float input and constant int8 weights, which LiteRT runs with its hybrid
        kernels (the input quantized per call). The C and ONNX exports each decide which of these they repeat."""
        if self.kind not in ("FULLY_CONNECTED", "CONV_2D") or len(self.inputs) < 2:
            return False
        x, w = self.inputs[:2]
        return x.dtype == np.float32 and w.dtype == np.int8 and w.value is not None


def hybrid_inexact(op: Op) -> str | None:
    """The one rule C and ONNX ask of a dynamic-range op: why its hybrid kernel is not repeated exactly
    (LiteRT runs sparse weights with another kernel; only symmetric per-channel or per-tensor int8 weights
    are repeated), or None when it is. A target widens such an op where it can, and says so in its record."""
    w = op.inputs[1]
    if w.sparse:
        return "sparse dynamic-range weights, which LiteRT runs with its sparse hybrid kernel"
    if w.scales is None or np.any(w.zero_points != 0) or (w.scales.size > 1 and w.axis != 0):
        return "dynamic-range int8 weights not symmetric per output channel or per tensor"
    return None


@dataclass
class PolicyGraph:
    """The ops from the observation to the action, in execution order."""

    observation: Tensor
    action: Tensor
    ops: list[Op]
    caller_normalization: Normalization | None
    label: str
    outputs: dict[str, Tensor] = field(default_factory=dict)

    @property
    def action_head(self) -> Tensor:
        """The tensor `action` is the argmax of (the Q-values, or the advantage head of a split output)."""
        return next(op for op in self.ops if op.outputs[0] is self.action).inputs[0]

    @property
    def n_actions(self) -> int:
        return int(self.action_head.shape[-1])

    @property
    def obs_shape(self) -> tuple[int, ...]:
        return self.observation.shape[1:]

    @property
    def integer(self) -> bool:
        """Whether the action is computed in integers (a full-integer policy)."""
        return self.action_head.dtype.kind == "i"


def read_policy_graph(source: Any, outputs: tuple[str, ...] = ("action",)) -> PolicyGraph:
    """The ops that compute the named signature outputs of a compress-dqn .tflite policy."""
    schema = litert_schema()
    data, label = read_tflite(source)
    model = decode(data, label, schema)
    if len(model.subgraphs) != 1:
        raise UserError(f"{label}: {len(model.subgraphs)} subgraphs; export a compress-dqn policy (one subgraph)")
    sig = next((s for s in model.signatureDefs or [] if (s.signatureKey or b"").decode() == SIGNATURE), None)
    if sig is None or len(sig.inputs) != 1:
        raise UserError(f"{label}: no {SIGNATURE!r} signature with one input; export it with compress-dqn")
    named = {e.name.decode(): int(e.tensorIndex) for e in sig.outputs}
    if "action" not in named:
        raise UserError(f"{label}: its signature has no `action` output (has {sorted(named)}); export it with compress-dqn")
    reader = _Reader(model, schema)
    graph_ops = reader.ops()
    wanted = [named[name] for name in outputs if name in named]
    ops = _needed(graph_ops, wanted)
    observation = reader.tensor(int(sig.inputs[0].tensorIndex))
    features = int(np.prod(observation.shape[1:]))
    integer_input = observation.dtype.kind in "iu" and observation.scales is not None
    normalization = caller_normalization(data, label, features, integer_input)
    return PolicyGraph(observation, reader.tensor(named["action"]), ops, normalization, label,
                       {name: reader.tensor(named[name]) for name in outputs if name in named})


class _Reader:
    """Tensors and ops of a ModelT, each tensor read once (ops share their Tensor objects)."""

    def __init__(self, model: Any, schema: Any) -> None:
        self.model, self.schema, self.graph = model, schema, model.subgraphs[0]
        self._tensors: dict[int, Tensor] = {}
        self._ops_by_code = op_names(schema)
        self._types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}

    def tensor(self, index: int) -> Tensor:
        if index not in self._tensors:
            t = self.graph.tensors[index]
            type_name = self._types[t.type]
            packed = type_name == "INT4"  # a low-bit kernel (quantize.kernel_bits), read as int8
            if type_name not in _DTYPES and not packed:
                raise UserError(f"tensor {index} is {type_name}; the exporter reads {sorted([*_DTYPES, 'INT4'])} only")
            dtype = np.dtype(np.int8 if packed else _DTYPES[type_name]).newbyteorder("<")
            shape = tuple(int(d) for d in (t.shape if t.shape is not None else []))
            tensor = Tensor(index, shape, np.dtype(dtype.type))
            q = t.quantization
            if q is not None and q.scale is not None and len(q.scale):
                tensor.scales = np.asarray(q.scale, np.float32)
                tensor.zero_points = np.asarray(q.zeroPoint, np.int64)
                tensor.axis = int(q.quantizedDimension)
            data = self.model.buffers[t.buffer].data if t.buffer < len(self.model.buffers) else None
            if packed and (data is None or not len(data) or t.sparsity is not None):
                raise UserError(f"tensor {index} is INT4 and not a dense constant; the exporter reads INT4 weights only")
            if data is not None and len(data):
                raw = bytes(np.asarray(data, np.uint8))
                values = _unpacked_int4(raw, int(np.prod(shape))) if packed else np.frombuffer(raw, dtype=dtype)
                tensor.value = _dense(t.sparsity, values, shape) if t.sparsity is not None else values.reshape(shape or ())
                tensor.sparse = t.sparsity is not None
                tensor.int4 = packed
            self._tensors[index] = tensor
        return self._tensors[index]

    def ops(self) -> list[Op]:
        ops, widened = [], {}
        for raw in self.graph.operators:
            code = self.model.operatorCodes[raw.opcodeIndex]
            kind = self._ops_by_code.get(builtin(code), "CUSTOM")
            if kind not in SUPPORTED:
                raise UserError(f"its graph holds a {kind} op, which the exporter does not translate "
                                f"(it translates {', '.join(sorted(SUPPORTED))})")
            inputs = [self.tensor(int(i)) if i >= 0 else None for i in raw.inputs]
            outputs = [self.tensor(int(i)) for i in raw.outputs]
            if kind == "DENSIFY":  # a sparse-format constant, already dense (_dense)
                outputs[0].value = inputs[0].value
                continue
            if kind == "DEQUANTIZE" and inputs[0].value is not None:  # a float16 (or int8) constant, widened
                out = outputs[0]
                out.value = inputs[0].real() if inputs[0].quantized else inputs[0].value.astype(np.float32)
                widened[out.index] = out
                continue
            options = {k: v for k, v in vars(raw.builtinOptions).items()} if raw.builtinOptions is not None else {}
            ops.append(Op(kind, inputs, outputs, options))
        return ops


def _unpacked_int4(raw: bytes, count: int) -> np.ndarray:
    """INT4 values packed two a byte, the first in the low nibble (TFLite's layout), as int8."""
    nibbles = np.frombuffer(raw, np.uint8)
    pairs = np.stack([nibbles & 0x0F, nibbles >> 4], axis=1).reshape(-1)[:count].astype(np.int8)
    return np.where(pairs > 7, pairs - 16, pairs).astype(np.int8)


def _dense(sparsity: Any, values: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A 2-D sparse-format constant (rows DENSE, columns SPARSE_CSR, no blocks) as a dense array."""
    dims = sparsity.dimMetadata or []
    order = list(sparsity.traversalOrder) if sparsity.traversalOrder is not None else []
    if (len(shape) != 2 or order != [0, 1] or len(dims) != 2 or dims[0].format != 0 or dims[1].format != 1
            or (sparsity.blockMap is not None and len(sparsity.blockMap))):
        raise UserError("a block-sparse weight tensor; export the policy without prune.sparse_format")
    segments = np.asarray(dims[1].arraySegments.values, np.int64)
    indices = np.asarray(dims[1].arrayIndices.values, np.int64)
    dense = np.zeros(shape, values.dtype)
    for row in range(shape[0]):
        start, end = segments[row], segments[row + 1]
        dense[row, indices[start:end]] = values[start:end]
    return dense


def _needed(ops: list[Op], wanted: list[int]) -> list[Op]:
    """The ops the wanted tensors depend on, in their order."""
    needed, keep = set(wanted), []
    for op in reversed(ops):
        if any(t.index in needed for t in op.outputs):
            keep.append(op)
            needed |= {t.index for t in op.inputs if t is not None and t.value is None}
    return keep[::-1]


# The constants every integer target (C, ONNX) computes its requantization and geometry from.


def int8_bounds(out: Tensor, activation: str) -> tuple[int, int]:
    """CalculateActivationRangeQuantized: zero_point + roundf(bound / scale), in float as LiteRT does."""
    scale, zero = np.float32(out.scales[0]), int(out.zero_points[0])

    def q(bound: float) -> int:
        v = float(np.float32(bound) / scale)
        return zero + int(math.copysign(math.floor(abs(v) + 0.5), v))

    lo, hi = -128, 127
    if activation in ("RELU", "RELU6"):
        lo = max(lo, q(0.0))
    if activation == "RELU6":
        hi = min(hi, q(6.0))
    if activation == "RELU_N1_TO_1":
        lo, hi = max(lo, q(-1.0)), min(hi, q(1.0))
    if activation == "UNSUPPORTED":
        raise UserError("a fused activation the C and ONNX exports do not translate")
    return lo, hi


def double_multiplier(input_scale: float, filter_scale: float, output_scale: float) -> tuple[int, int]:
    """M = input_scale * filter_scale / output_scale in double (as LiteRT's reference FULLY_CONNECTED),
    as m * 2^-s with m its 53-bit significand."""
    value = float(np.float32(input_scale)) * float(np.float32(filter_scale)) / float(np.float32(output_scale))
    if value <= 0:
        return 0, 0
    fraction, exponent = math.frexp(value)
    return int(fraction * (1 << 53)), 53 - exponent


def quantize_multiplier(value: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: value = q * 2^(shift - 31), q in [2^30, 2^31), rounded half away."""
    if value == 0:
        return 0, 0
    fraction, shift = math.frexp(value)
    q = int(math.floor(fraction * (1 << 31) + 0.5))
    if q == 1 << 31:
        q, shift = q // 2, shift + 1
    if shift < -31:
        return 0, 0
    return q, shift


def conv_geometry(op: Op) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]:
    """A CONV_2D's strides, dilations and pads (top, left, bottom, right), as TFLite's
    ComputePaddingHeightWidth: SAME pads floor(total / 2) before and the rest after; VALID none."""
    _, ih, iw, _ = op.inputs[0].shape
    _, kh, kw, _ = op.inputs[1].shape
    _, oh, ow, _ = op.outputs[0].shape
    o = op.options
    sh, sw, dh, dw = (int(o.get(k, 1)) for k in ("strideH", "strideW", "dilationHFactor", "dilationWFactor"))
    if int(o.get("padding", 1)) != 0:  # Padding_VALID == 1
        return (sh, sw), (dh, dw), (0, 0, 0, 0)

    def total(size: int, kernel: int, stride: int, dilation: int, out: int) -> int:
        return max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)

    th, tw = total(ih, kh, sh, dh, oh), total(iw, kw, sw, dw, ow)
    return (sh, sw), (dh, dw), (th // 2, tw // 2, th - th // 2, tw - tw // 2)
