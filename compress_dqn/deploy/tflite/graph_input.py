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

from compress_dqn.deploy.tflite.file import TFLiteFile, edit_bytes
from compress_dqn.deploy.tflite.metadata import mark_input_normalization
from compress_dqn.envs.normalization import Normalization


def carry_normalization(model: TFLiteFile, normalization: Normalization) -> None:
    """The model made to take raw observations, in place: normalization in the graph where its input
    is float, else (an integer input, quantized by the caller) written as the metadata the caller must follow."""
    graph = model.graph
    if graph.tensors[int(graph.inputs[0])].type != model.schema.TensorType.FLOAT32:
        mark_input_normalization(model, normalization)
    else:
        normalization_ops(model, normalization)


def carry_input_normalization(data: bytes, normalization: Normalization) -> bytes:
    """The file's bytes with `carry_normalization` applied."""
    return edit_bytes(data, carry_normalization, normalization)


def normalization_ops(model: TFLiteFile, normalization: Normalization) -> None:
    """`x = (observations - mean) / std` (float SUB, DIV) computed in front of the model's input, in place.

    The old float input becomes the normalized tensor x, so everything that read the input (the
    QUANTIZE of an integer model) now reads x; a new raw input takes its place in the graph and the
    serving signature.
    """
    schema, fb = model.schema, model.model
    if len(fb.subgraphs) != 1 or len(fb.subgraphs[0].inputs) != 1:
        raise ValueError("expected one subgraph with one input")
    graph = model.graph
    x_index = int(graph.inputs[0])
    x = graph.tensors[x_index]
    mean, std = np.asarray(normalization.mean, np.float32).ravel(), np.asarray(normalization.std, np.float32).ravel()
    if x.type != schema.TensorType.FLOAT32 or int(x.shape[-1]) != mean.size or x.shape.size != 2:
        raise ValueError(f"expected a float32 [batch, {mean.size}] input")
    first = len(graph.tensors)  # inner tensors named by index, as tflite_metadata.short_tensor_names does
    raw = _tensor(schema, x, x.name, buffer=0)
    centered = _tensor(schema, x, f"t{first + 1}".encode(), buffer=0)
    mean_t = _constant(model, mean, f"t{first + 2}".encode())
    std_t = _constant(model, std, f"t{first + 3}".encode())
    x.name = f"t{x_index}".encode()
    graph.tensors += [raw, centered, mean_t, std_t]
    raw_i, centered_i, mean_i, std_i = range(first, first + 4)
    sub = model.op(schema.BuiltinOperator.SUB, [raw_i, mean_i], [centered_i],
                   options_type=schema.BuiltinOptions.SubOptions, options=schema.SubOptionsT())
    div = model.op(schema.BuiltinOperator.DIV, [centered_i, std_i], [x_index],
                   options_type=schema.BuiltinOptions.DivOptions, options=schema.DivOptionsT())
    graph.operators = [sub, div, *graph.operators]
    graph.inputs = np.array([raw_i], dtype=np.int32)
    for sig in fb.signatureDefs or []:
        for entry in sig.inputs or []:
            if entry.tensorIndex == x_index:
                entry.tensorIndex = raw_i
    model.edited = True



def _tensor(schema: Any, like: Any, name: bytes, buffer: int) -> Any:
    tensor = schema.TensorT()
    tensor.shape = np.array(like.shape)
    tensor.shapeSignature = None if like.shapeSignature is None else np.array(like.shapeSignature)
    tensor.type, tensor.buffer, tensor.name = schema.TensorType.FLOAT32, buffer, name
    return tensor


def _constant(model: TFLiteFile, values: np.ndarray, name: bytes) -> Any:
    tensor = model.schema.TensorT()
    tensor.shape, tensor.type, tensor.name = np.array([values.size], np.int32), model.schema.TensorType.FLOAT32, name
    tensor.buffer = model.add_buffer(values.astype("<f4").tobytes())
    return tensor


def graph_normalization(source: bytes | TFLiteFile) -> Normalization | None:
    """The normalization normalization_ops put in front of the model's input, or None."""
    model = source if isinstance(source, TFLiteFile) else TFLiteFile.decode(source)
    schema, graph = model.schema, model.graph
    ops = graph.operators or []
    if len(ops) < 2:
        return None
    kinds = [model.builtin(op) for op in ops[:2]]
    sub, div = ops[:2]
    if (kinds != [schema.BuiltinOperator.SUB, schema.BuiltinOperator.DIV] or int(sub.inputs[0]) != int(graph.inputs[0])
            or int(div.inputs[0]) != int(sub.outputs[0])):
        return None

    def values(index: int) -> np.ndarray:
        data = model.model.buffers[graph.tensors[index].buffer].data
        return np.frombuffer(bytes(data), dtype="<f4").astype(np.float32)

    return Normalization(values(int(sub.inputs[1])), values(int(div.inputs[1])))
