"""Weight-only int8: the kernels stored in int8, the activations and arithmetic in float.

Neither of the converter's int8 forms keeps a small network's activations exact. Full integer
(ptq-int8, QAT) rounds each activation to one of 256 steps of a range fixed at conversion, and
dynamic range quantizes each layer's input per call (LiteRT's hybrid kernels), storing in int8 only
the kernels of 1,024 weights or more: a distilled student's small kernels stay float32, four bytes a
weight. On the RL Zoo's DQN Acrobot every int8-activation student lost the return where a float
one kept it (docs/zoo-search.md). Here each float32 constant kernel of a FULLY_CONNECTED or CONV_2D
is stored as symmetric int8 with one scale per output unit or filter, behind a DEQUANTIZE that
widens it to float32; LiteRT widens such a constant once, as it does float16 weights, and the
layer runs its float kernel. The output layers' kernels are stored in float16 instead: the action
is the argmax of their outputs, whose gaps on such tasks are a few hundredths of the Q-values (an
int8 row rounds each weight by up to 1/254 of that row's largest), and they are a few hundred
weights. The C and ONNX exports read each widened kernel (graph.PolicyGraph.ops).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.file import TFLiteFile

DEQUANTIZE_VERSION = {"int8": 5, "float16": 3}
"""The DEQUANTIZE version LiteRT's op versioning gives an int8 input with a scale per channel, and a float16 one."""


def int8_weight_only(model: TFLiteFile) -> None:
    """Store each float32 constant kernel of a FULLY_CONNECTED or CONV_2D in int8 behind a DEQUANTIZE,
    an output layer's in float16 (in place). Biases, sparse-format kernels and a kernel two layers
    share stay as they are."""
    schema, graph = model.schema, model.graph
    layers = {schema.BuiltinOperator.FULLY_CONNECTED, schema.BuiltinOperator.CONV_2D}
    readers: dict[int, list[Any]] = {}
    for op in graph.operators:
        for i in op.inputs:
            if i >= 0:
                readers.setdefault(int(i), []).append(op)
    widen = []
    for op in graph.operators:
        if model.builtin(op) not in layers or len(op.inputs) < 2 or op.inputs[1] < 0:
            continue
        index = int(op.inputs[1])
        kernel = graph.tensors[index]
        data = model.model.buffers[kernel.buffer].data if kernel.buffer else None
        if (kernel.type != schema.TensorType.FLOAT32 or data is None or len(data) == 0
                or kernel.sparsity is not None or len(readers[index]) > 1):
            continue
        values = np.frombuffer(np.asarray(data, np.uint8).tobytes(), "<f4").reshape(tuple(kernel.shape))
        output = not any(model.builtin(r) in layers for r in readers.get(int(op.outputs[0]), []))
        widen.append(_behind_dequantize(model, index, values, "float16" if output else "int8"))
    graph.operators = widen + list(graph.operators)  # each widened before the layers that read it
    model.edited = model.edited or bool(widen)


def _behind_dequantize(model: TFLiteFile, index: int, values: np.ndarray, form: str) -> Any:
    """The kernel tensor at `index` becomes the float32 output of a new DEQUANTIZE whose input is a new
    constant holding it in `form`; returns that op. The float32 bytes leave the file."""
    schema, graph = model.schema, model.graph
    kernel = graph.tensors[index]
    constant = schema.TensorT()
    constant.shape = np.array(kernel.shape, np.int32)
    if form == "int8":
        stored, scales = symmetric_per_channel(values)
        constant.type = schema.TensorType.INT8
        constant.quantization = schema.QuantizationParametersT()
        constant.quantization.scale = scales
        constant.quantization.zeroPoint = np.zeros(scales.size, np.int64)
        constant.quantization.quantizedDimension = 0
    else:
        stored, constant.type = values.astype("<f2"), schema.TensorType.FLOAT16
    constant.buffer = model.add_buffer(stored.tobytes())
    graph.tensors.append(constant)
    if sum(t.buffer == kernel.buffer for t in graph.tensors) == 1:  # the converter may share equal constants
        model.model.buffers[kernel.buffer].data = None
    kernel.buffer = 0  # computed now: the DEQUANTIZE's output
    return model.op(schema.BuiltinOperator.DEQUANTIZE, [len(graph.tensors) - 1], [index],
                    version=DEQUANTIZE_VERSION[form])


def symmetric_per_channel(kernel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 values in [-127, 127] and one scale per output unit or filter (the first axis), as the
    converter rounds a per-channel int8 kernel."""
    top = np.abs(kernel.reshape(kernel.shape[0], -1)).max(axis=1)
    scales = np.where(top > 0, top / 127.0, 1.0).astype(np.float32)
    shape = (-1,) + (1,) * (kernel.ndim - 1)
    values = np.clip(np.round(kernel / scales.reshape(shape)), -127, 127).astype(np.int8)
    return values, scales
