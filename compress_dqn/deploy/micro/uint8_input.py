"""A raw uint8 observation (MinAtar's 0/1 grids, Atari's pixels) on TFLite Micro: its first op rewritten.

compress-dqn's policies take such an observation as uint8 and CAST it to float32 first; TFLM's CAST
has no uint8 input, so TFLM refuses the model as written. Two of TFLM's kernels do take uint8
(tensorflow/lite/micro/kernels/quantize_common.cc, dequantize_common.cc):

- QUANTIZE uint8 -> int8 requantizes. Where the CAST feeds a QUANTIZE to int8 directly (a
  full-integer policy), both become one QUANTIZE whose uint8 input has scale 1 and zero point 0:
  q = x / s_out + zp_out, as before, in TFLM's fixed point rather than float; kept only where TFLM
  gives the float kernel's q = round(x / s_out) + zp_out on every one of the 256 inputs.
- DEQUANTIZE uint8 -> float32 with scale 1 and zero point 0 is float(x), exactly what CAST computes:
  any other CAST (a float policy, or a QUANTIZE whose table differs) becomes that DEQUANTIZE.

The model still takes the raw uint8 observation, which the caller passes unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.deploy.micro.model import ModelInfo, aligned, inspect_model, refuse_missing, tflm_runtime
from compress_dqn.deploy.tflite.file import TFLiteFile


def runnable_model(data: bytes, info: ModelInfo, label: str, model: TFLiteFile | None = None) -> tuple[bytes, ModelInfo]:
    """The model as TFLM runs it, and its ops: refused where TFLM lacks an op; a uint8
    observation's CAST rewritten (uint8_input_model). The one path the export, the summary and the
    player share, so what is measured and played is what is shipped. `model`: the file already
    decoded, which tells whether there is a CAST to rewrite without reading the bytes again."""
    refuse_missing(info, label)
    raw = uint8_input_model(data) if model is None or casts_uint8_input(model) else data
    return (data, info) if raw is data else (raw, inspect_model(raw, label))


def casts_uint8_input(model: TFLiteFile) -> bool:
    """Whether a CAST reads a uint8 graph input (else uint8_input_model has nothing to rewrite)."""
    graph, schema = model.graph, model.schema
    inputs = {int(i) for i in (graph.inputs if graph.inputs is not None else [])
              if graph.tensors[int(i)].type == schema.TensorType.UINT8}
    return any(model.builtin(op) == schema.BuiltinOperator.CAST and op.inputs is not None
               and any(int(i) in inputs for i in op.inputs) for op in graph.operators or [])


def uint8_input_model(data: bytes) -> bytes:
    """The model with its uint8 observation's CAST replaced by ops TFLM runs; `data` itself when there is none."""
    tflm_runtime()
    from tflite_micro.tensorflow.lite.micro.compression import model_editor as editor
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    types, ops = schema.TensorType, schema.BuiltinOperator
    model = editor.read(data)
    if len(model.subgraphs) != 1:
        return data
    graph = model.subgraphs[0]
    by_index = {t.index: t for t in graph.tensors}  # original indices, as the signatures use them
    changed = False
    for obs in graph.inputs:
        users = graph.consumers_of(obs)
        if obs.dtype != types.UINT8 or not users or any(
                op.opcode != ops.CAST or op.outputs[0].dtype != types.FLOAT32 for op in users):
            continue
        _unit_scale(editor, obs)
        for cast in users:
            after = graph.consumers_of(cast.outputs[0])
            quantize = after[0] if len(after) == 1 and after[0].opcode == ops.QUANTIZE else None
            if (quantize is not None and quantize.outputs[0].dtype == types.INT8
                    and not any(cast.outputs[0] is t for t in graph.outputs) and _requantize_exact(quantize.outputs[0])):
                quantize.inputs = [obs]  # uint8 -> int8 in one QUANTIZE; CAST and its float tensor go
                graph.operators = [op for op in graph.operators if op is not cast]
                graph.tensors = [t for t in graph.tensors if t is not cast.outputs[0]]
            else:  # DEQUANTIZE(scale 1, zero point 0) is CAST's float(x)
                cast.opcode = ops.DEQUANTIZE
                cast._fb.builtinOptionsType, cast._fb.builtinOptions = 0, None
        changed = True
    if not changed:
        return data
    position = {id(t): i for i, t in enumerate(graph.tensors)}
    for sig in model._fb.signatureDefs or []:  # a removed tensor shifts the indices after it
        for entry in [*(sig.inputs or []), *(sig.outputs or [])]:
            entry.tensorIndex = position[id(by_index[entry.tensorIndex])]
    return aligned(bytes(model.build()))


def _unit_scale(editor: Any, tensor: Any) -> None:
    tensor.quantization = editor.Quantization(scales=[1.0], zero_points=[0])


def _requantize_exact(out: Any) -> bool:
    """Whether TFLM's QUANTIZE uint8 (scale 1) -> `out` gives round(x / scale) + zero point for all 256 x."""
    quant = out.quantization
    if quant is None or len(quant.scales) != 1:
        return False
    scale, zero_point = float(quant.scales[0]), int(quant.zero_points[0]) if len(quant.zero_points) else 0
    x = np.arange(256, dtype=np.float32)
    ratio = x / np.float32(scale)  # float32, as the float kernel divides
    expected = np.clip(np.sign(ratio) * np.floor(np.abs(ratio) + np.float32(0.5)) + zero_point, -128, 127)
    return bool(np.array_equal(_tflm_requantize(scale, zero_point), expected.astype(np.int8)))


def _tflm_requantize(scale: float, zero_point: int) -> np.ndarray:
    """TFLM's own QUANTIZE uint8 (scale 1, zero point 0) -> int8 (scale, zero_point) on 0..255, run in TFLM."""
    from tflite_micro.tensorflow.lite.micro.compression import model_editor as editor
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    x = editor.Tensor(shape=(256,), dtype=schema.TensorType.UINT8, name="x",
                      quantization=editor.Quantization(scales=[1.0], zero_points=[0]))
    q = editor.Tensor(shape=(256,), dtype=schema.TensorType.INT8, name="q",
                      quantization=editor.Quantization(scales=[scale], zero_points=[zero_point]))
    op = editor.Operator(opcode=schema.BuiltinOperator.QUANTIZE, inputs=[x], outputs=[q])
    model = editor.Model(subgraphs=[editor.Subgraph(tensors=[x, q], operators=[op], inputs=[x], outputs=[q])])
    interp = tflm_runtime().Interpreter.from_bytes(bytes(model.build()), arena_size=16 * 1024)
    interp.set_input(np.arange(256, dtype=np.uint8), 0)
    interp.invoke()
    return np.array(interp.get_output(0)).reshape(-1).astype(np.int8)

