"""Puts a policy's per-feature input normalization inside its TFLite graph: the file takes raw observations.

Why: an integer policy is calibrated on (obs - mean) / std, so that each feature keeps its own
range through the input's single int8 scale. Kept as metadata, that step was applied by
compress-dqn's loaders only: LiteRT's plain `Interpreter`, TFLite Micro or anyone's C++ fed the
raw observation and played a policy worse than random, silently. As two float ops (SUB, DIV) in
front of the input QUANTIZE, every runtime applies it, bit for bit as numpy's float32
`(obs - mean) / std` does. A policy with an integer input (int8 I/O) cannot carry it: its caller
quantizes, so it must normalize first; that file keeps the metadata entry that says how
(tflite_metadata.with_input_normalization).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.deploy.tflite_metadata import pack_model, with_input_normalization


def carry_input_normalization(data: bytes, mean: np.ndarray, std: np.ndarray) -> bytes:
    """The model taking raw observations: normalization in the graph where its input is float, else
    (an integer input, quantized by the caller) written as the metadata the caller must follow."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    graph = model.subgraphs[0]
    if graph.tensors[int(graph.inputs[0])].type != schema.TensorType.FLOAT32:
        return with_input_normalization(data, mean, std)
    return with_normalization_ops(data, mean, std)


def with_normalization_ops(data: bytes, mean: np.ndarray, std: np.ndarray) -> bytes:
    """The model with `x = (observations - mean) / std` (float SUB, DIV) computed in front of its input.

    The old float input becomes the normalized tensor x, so everything that read the input (the
    QUANTIZE of an integer model) now reads x; a new raw input takes its place in the graph and the
    serving signature.
    """
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    if len(model.subgraphs) != 1 or len(model.subgraphs[0].inputs) != 1:
        raise ValueError("expected one subgraph with one input")
    graph = model.subgraphs[0]
    x_index = int(graph.inputs[0])
    x = graph.tensors[x_index]
    mean, std = np.asarray(mean, np.float32).ravel(), np.asarray(std, np.float32).ravel()
    if x.type != schema.TensorType.FLOAT32 or int(x.shape[-1]) != mean.size or x.shape.size != 2:
        raise ValueError(f"expected a float32 [batch, {mean.size}] input")
    first = len(graph.tensors)  # inner tensors named by index, as tflite_metadata.slim_tensor_names does
    raw = _tensor(schema, x, x.name, buffer=0)
    centered = _tensor(schema, x, f"t{first + 1}".encode(), buffer=0)
    mean_t = _constant(schema, model, mean, f"t{first + 2}".encode())
    std_t = _constant(schema, model, std, f"t{first + 3}".encode())
    x.name = f"t{x_index}".encode()
    graph.tensors += [raw, centered, mean_t, std_t]
    raw_i, centered_i, mean_i, std_i = range(first, first + 4)
    sub = _op(schema, model, schema.BuiltinOperator.SUB, [raw_i, mean_i], [centered_i],
              schema.BuiltinOptions.SubOptions, schema.SubOptionsT())
    div = _op(schema, model, schema.BuiltinOperator.DIV, [centered_i, std_i], [x_index],
              schema.BuiltinOptions.DivOptions, schema.DivOptionsT())
    graph.operators = [sub, div, *graph.operators]
    graph.inputs = np.array([raw_i], dtype=np.int32)
    for sig in model.signatureDefs or []:
        for entry in sig.inputs or []:
            if entry.tensorIndex == x_index:
                entry.tensorIndex = raw_i
    return pack_model(model, len(data) + 8 * mean.size + 512)


def _tensor(schema: Any, like: Any, name: bytes, buffer: int) -> Any:
    tensor = schema.TensorT()
    tensor.shape = np.array(like.shape)
    tensor.shapeSignature = None if like.shapeSignature is None else np.array(like.shapeSignature)
    tensor.type, tensor.buffer, tensor.name = schema.TensorType.FLOAT32, buffer, name
    return tensor


def _constant(schema: Any, model: Any, values: np.ndarray, name: bytes) -> Any:
    buffer = schema.BufferT()
    buffer.data = np.frombuffer(values.astype("<f4").tobytes(), dtype=np.uint8)
    model.buffers.append(buffer)
    tensor = schema.TensorT()
    tensor.shape, tensor.type, tensor.name = np.array([values.size], np.int32), schema.TensorType.FLOAT32, name
    tensor.buffer = len(model.buffers) - 1
    return tensor


def _op(schema: Any, model: Any, code: int, inputs: list[int], outputs: list[int], options_type: int, options: Any) -> Any:
    """An operator of builtin `code` (its operator code added to the model where missing; version 1: float)."""
    codes = model.operatorCodes
    index = next((i for i, c in enumerate(codes) if _builtin(c) == code and not c.customCode), None)
    if index is None:
        entry = schema.OperatorCodeT()
        entry.builtinCode, entry.deprecatedBuiltinCode, entry.version = code, min(code, 127), 1
        codes.append(entry)
        index = len(codes) - 1
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = index, np.array(inputs, np.int32), np.array(outputs, np.int32)
    op.builtinOptionsType, op.builtinOptions = options_type, options
    return op


def _builtin(code: Any) -> int:
    """An operator code's builtin op (the schema keeps codes below 127 in a deprecated field too)."""
    return max(code.builtinCode, code.deprecatedBuiltinCode)


def graph_normalization(data: bytes) -> tuple[np.ndarray, np.ndarray] | None:
    """(mean, std) of a normalization with_normalization_ops put in front of the model's input, or None."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)
    graph = model.subgraphs[0]
    ops = graph.operators or []
    if len(ops) < 2:
        return None
    kinds = [_builtin(model.operatorCodes[op.opcodeIndex]) for op in ops[:2]]
    sub, div = ops[:2]
    if (kinds != [schema.BuiltinOperator.SUB, schema.BuiltinOperator.DIV] or int(sub.inputs[0]) != int(graph.inputs[0])
            or int(div.inputs[0]) != int(sub.outputs[0])):
        return None

    def values(index: int) -> np.ndarray:
        data = model.buffers[graph.tensors[index].buffer].data
        return np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)

    return values(int(sub.inputs[1])), values(int(div.inputs[1]))
