"""Rewriting a policy for TFLite Micro: int8 input and q_values, and TFLM's look-up-table weight compression."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.graph_input import graph_normalization
from compress_dqn.deploy.micro.arena import measure_arena
from compress_dqn.deploy.micro.model import aligned, tflm_runtime
from compress_dqn.deploy.micro.play import same_outputs
from compress_dqn.deploy.tflite.metadata import with_input_normalization
from compress_dqn.deploy.tflite.reader import SIGNATURE
from compress_dqn.errors import UserError


def _editor() -> Any:
    tflm_runtime()
    from tflite_micro.tensorflow.lite.micro.compression import model_editor

    return model_editor


_INT8_IO_HINT = ("--int8-io needs a full-integer policy: export it with quantize: {mode: int8} or {mode: qat} "
                 "(int8_io: true there writes int8 io directly)")


class _Int8IO:
    """One int8-io rewrite of a policy graph: the float tensors to replace and the ops to drop."""

    def __init__(self, editor: Any, schema: Any, model: Any, label: str) -> None:
        self.editor, self.schema, self.model, self.label = editor, schema, model, label
        self.types, self.ops = schema.TensorType, schema.BuiltinOperator
        if len(model.subgraphs) != 1:
            raise UserError(f"{label}: {len(model.subgraphs)} subgraphs; --int8-io rewrites single-graph policies only")
        self.graph = model.subgraphs[0]
        self.sig = next((s for s in (model._fb.signatureDefs or []) if s.signatureKey.decode() == SIGNATURE), None)
        if self.sig is None or len(self.graph.inputs) != 1:
            raise UserError(f"{label}: no {SIGNATURE!r} signature with one input; export it with compress-dqn")
        outputs = {o.name.decode(): o for o in self.sig.outputs or []}
        self.by_index = {t.index: t for t in self.graph.tensors}  # original indices, as the signature uses them
        self.q = self.by_index.get(outputs["q_values"].tensorIndex) if "q_values" in outputs else None
        if self.q is None:
            raise UserError(f"{label}: signature {SIGNATURE!r} has no q_values output; export it with compress-dqn")
        self.replace: dict[int, Any] = {}  # id(float tensor) -> the int8 tensor taking its place
        self.dropped: list[Any] = []  # ops whose work the rewrite removes

    def producer(self, tensor: Any) -> Any:
        return next((op for op in self.graph.operators if any(t is tensor for t in op.outputs)), None)

    def dequantized_int8(self, tensor: Any) -> Any:
        """The DEQUANTIZE op making `tensor` from a per-tensor int8 one, or None."""
        op = self.producer(tensor)
        ok = op is not None and op.opcode == self.ops.DEQUANTIZE and op.inputs[0].dtype == self.types.INT8
        return op if ok and op.inputs[0].quantization is not None and len(op.inputs[0].quantization.scales) == 1 else None

    def input(self) -> None:
        """Drop the QUANTIZE after a float observation input, and the normalization (SUB, DIV) before
        it where the graph has one (the caller applies both: graph_input.py)."""
        obs = self.graph.inputs[0]
        if obs.dtype == self.types.FLOAT32:
            chain = self._normalization_ops(obs)
            head = chain[-1].outputs[0] if chain else obs
            users = self.graph.consumers_of(head)
            if len(users) != 1 or users[0].opcode != self.ops.QUANTIZE or users[0].outputs[0].dtype != self.types.INT8:
                raise UserError(f"{self.label}: its float input is not quantized to int8 first (a float model?); {_INT8_IO_HINT}")
            self.replace[id(obs)] = users[0].outputs[0]
            self.dropped += [*chain, users[0]]
        elif obs.dtype not in (self.types.INT8, self.types.UINT8):  # a raw uint8 observation stays as it is
            raise UserError(f"{self.label}: its input is {_type_name(self.schema, obs.dtype)}, not float32, int8 or uint8; "
                            "--int8-io cannot rewrite it")

    def _normalization_ops(self, obs: Any) -> list[Any]:
        """[SUB, DIV] where the observation is normalized by them alone (graph_input.py), else []."""
        users = self.graph.consumers_of(obs)
        if len(users) != 1 or users[0].opcode != self.ops.SUB:
            return []
        after = self.graph.consumers_of(users[0].outputs[0])
        return [users[0], after[0]] if len(after) == 1 and after[0].opcode == self.ops.DIV else []

    def output(self) -> None:
        """Drop the DEQUANTIZE before float q_values, or make a split head's float ADD an int8 one."""
        q = self.q
        if q.dtype == self.types.INT8:
            return
        if q.dtype != self.types.FLOAT32:
            raise UserError(f"{self.label}: its q_values are {_type_name(self.schema, q.dtype)}; --int8-io cannot rewrite them")
        last = self.producer(q)
        if (deq := self.dequantized_int8(q)) is not None:
            self.replace[id(q)] = deq.inputs[0]
            self.dropped.append(deq)
        elif last is not None and last.opcode == self.ops.ADD and len(last.inputs) == 2 \
                and all(self.dequantized_int8(t) is not None for t in last.inputs):
            self._int8_add(last)
        else:
            raise UserError(f"{self.label}: its q_values are not computed from int8 (a float model?); {_INT8_IO_HINT}")

    def _int8_add(self, add: Any) -> None:
        """q = DEQUANTIZE(advantage) + DEQUANTIZE(value) -> an int8 ADD whose range is the sum of the heads'."""
        q, graph = self.q, self.graph
        heads = [self.dequantized_int8(t) for t in add.inputs]
        ranges = [((-128 - h.inputs[0].quantization.zero_points[0]) * h.inputs[0].quantization.scales[0],
                   (127 - h.inputs[0].quantization.zero_points[0]) * h.inputs[0].quantization.scales[0]) for h in heads]
        low, high = sum(r[0] for r in ranges), sum(r[1] for r in ranges)
        scale = (high - low) / 255.0
        zero_point = int(np.clip(round(-128 - low / scale), -128, 127))
        q8 = self.editor.Tensor(shape=q.shape, dtype=self.types.INT8, name=f"{q.name}_int8",
                                quantization=self.editor.Quantization(scales=[float(scale)], zero_points=[zero_point]))
        q8._fb.shapeSignature = q._fb.shapeSignature
        graph.tensors.append(q8)
        self.dropped += [h for h in heads if len(graph.consumers_of(h.outputs[0])) == 1  # the ADD alone
                         and not any(h.outputs[0] is t for t in graph.outputs)]
        add.inputs = [h.inputs[0] for h in heads]
        add.outputs = [q8]
        self.replace[id(q)] = q8
        for code in self.model.operator_codes:  # int8 ADD is version 2 of the op
            if code.builtin_code == self.ops.ADD and code.version < 2:
                code.version = 2

    def apply(self) -> None:
        """Remove the dropped ops and orphaned tensors, rewire io and the signature's tensor indices."""
        graph, replace = self.graph, self.replace
        graph.operators = [op for op in graph.operators if not any(op is gone for gone in self.dropped)]
        used = {id(t) for op in graph.operators for t in [*op.inputs, *op.outputs] if t is not None}
        orphans = {id(t) for op in self.dropped for t in op.outputs} | set(replace)
        orphans |= {id(t) for op in self.dropped for t in op.inputs if t is not None and t.buffer is not None}  # mean, std
        graph.tensors = [t for t in graph.tensors if id(t) in used or id(t) not in orphans]
        graph.inputs = [replace.get(id(t), t) for t in graph.inputs]
        graph.outputs = [replace.get(id(t), t) for t in graph.outputs]
        position = {id(t): i for i, t in enumerate(graph.tensors)}
        for entry in [*(self.sig.inputs or []), *(self.sig.outputs or [])]:  # indices shift when tensors before them go
            tensor = self.by_index[entry.tensorIndex]
            entry.tensorIndex = position[id(replace.get(id(tensor), tensor))]


def int8_io_model(data: bytes, label: str = "<bytes>") -> bytes:
    """The same full-integer policy with int8 observation input and int8 q_values output.

    Why: a device without an FPU should never convert floats. Removes the QUANTIZE after the float
    input (and the normalization in front of it, which then travels as the metadata the caller
    follows, see tflite_metadata.caller_normalization) and the DEQUANTIZE before the float q_values, as the TFLite converter does for
    inference_input_type=int8. A QAT split head (q = DEQUANTIZE(advantage) + DEQUANTIZE(value) in
    float) gets an int8 ADD instead, its output range the sum of the two heads' ranges: q_values
    move by at most half a step of that range, the `action` (argmax of the int8 advantage) not at
    all. A float model is refused.
    """
    editor = _editor()
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    model = editor.read(data)
    rewrite = _Int8IO(editor, schema, model, label)
    rewrite.input()
    rewrite.output()
    if not rewrite.replace:
        return data
    rewrite.apply()
    rewritten = bytes(model.build())
    normalization = graph_normalization(data)
    if normalization is not None:  # its ops are gone: the caller normalizes before quantizing
        rewritten = with_input_normalization(rewritten, normalization)
    return aligned(rewritten)


def _type_name(schema: Any, code: int) -> str:
    return {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}.get(code, str(code)).lower()


@dataclass
class LutCompression:
    """Outcome of trying TFLM's look-up-table weight compression on a model."""

    data: bytes | None
    """The compressed model, or None when it is not worth keeping."""
    flash_bytes: int | None
    """Its size when one could be built (kept or not)."""
    reason: str
    tensors: int = 0
    arena_bytes: int | None = None
    """Measured arena of the compressed model: decoded weights live in RAM, so it grows."""


def try_compression(data: bytes, label: str = "<bytes>") -> LutCompression:
    """TFLM's LUT compression of constant tensors with at most 128 distinct values (per tensor or channel).

    Kept only when the model gets smaller and TFLM's outputs stay bit-identical on probe inputs
    (LUT decoding is lossless, so a difference would be a bug). It needs a TFLM build with
    compression enabled and adds a DECODE op whose outputs live in the arena.
    """
    editor = _editor()
    from tflite_micro import compression
    from tflite_micro.tensorflow.lite.micro.compression import spec as cspec

    model = editor.read(data)
    builder = compression.SpecBuilder()
    chosen = 0
    for g, graph in enumerate(model.subgraphs):
        for t, tensor in enumerate(graph.tensors):
            if tensor.buffer is None or len(tensor.buffer.data) == 0 or _packed(tensor) or tensor.array is None:
                continue
            plan = _lut_plan(tensor)
            if plan is not None:
                bits, mode = plan
                builder.add_tensor(subgraph=g, tensor=t).with_lut(
                    index_bitwidth=bits, mode=cspec.PerTensor() if mode is None else cspec.PerChannel(axis=mode))
                chosen += 1
    if not chosen:
        return LutCompression(None, None, "no weight tensor has 128 or fewer distinct values (int8 weights use up to "
                           "255): a look-up table would make it larger; cluster the weights first", 0)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            packed = bytes(compression.compress(data, builder.build()))
    except Exception as exc:  # CompressionError or a tensor the compressor cannot take
        return LutCompression(None, None, f"TFLM's compressor refused it ({str(exc).splitlines()[0]})", chosen)
    if len(packed) >= len(data):
        return LutCompression(None, len(packed), f"compressed model is not smaller ({len(packed)} >= {len(data)} bytes)", chosen)
    try:
        same = same_outputs(data, packed, label)
    except UserError as exc:
        return LutCompression(None, len(packed), f"TFLM cannot run the compressed model ({exc})", chosen)
    if not same:
        return LutCompression(None, len(packed), "compressed model's outputs differ from the original's", chosen)
    arena = measure_arena(packed, label).arena_bytes
    return LutCompression(packed, len(packed), f"{chosen} tensor(s) LUT-compressed, outputs identical; decoded "
                       f"weights need {arena} bytes of arena", chosen, arena)


def _packed(tensor: Any) -> bool:
    """An INT4 tensor (quantize.kernel_bits): already two weights a byte, and TFLM's compressor
    has no numpy type to read it with."""
    from ai_edge_litert import schema_py_generated as schema

    return tensor.dtype == schema.TensorType.INT4


def _lut_plan(tensor: Any) -> tuple[int, int | None] | None:
    """(index bits, None for one table or the channel axis) when a LUT makes this tensor smaller."""
    array = np.asarray(tensor.array)
    if array.size < 16 or array.dtype.kind not in "iuf":
        return None
    original = array.nbytes
    best: tuple[int, tuple[int, int | None]] | None = None
    unique = len(np.unique(array))
    if unique <= 128:
        bits = max(1, math.ceil(math.log2(unique))) if unique > 1 else 1
        size = math.ceil(array.size * bits / 8) + unique * array.itemsize
        best = (size, (bits, None))
    quant = tensor.quantization
    if quant is not None and quant.axis is not None and array.ndim > quant.axis:
        axis = quant.axis
        per = max(len(np.unique(np.take(array, i, axis=axis))) for i in range(array.shape[axis]))
        if per <= 128:
            bits = max(1, math.ceil(math.log2(per))) if per > 1 else 1
            size = math.ceil(array.size * bits / 8) + array.shape[axis] * (2 ** bits) * array.itemsize
            if best is None or size < best[0]:
                best = (size, (bits, axis))
    if best is None or best[0] + 32 >= original:  # each compressed tensor also costs metadata
        return None
    return best[1]


