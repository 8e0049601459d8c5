"""Reading a .tflite file: its bytes checked, decoded once, and one answer to a file that is not a readable policy.

The one module that decodes a .tflite flatbuffer (the object tree every edit changes, and the metadata
entries read in place); TFLite Micro's own schema is decoded through it too (`decode(..., schema)`).

Every reader of the flatbuffer (the C and ONNX graph reader, TFLite Micro's inspection, the
LiteRT loaders) refuses a truncated or damaged file through `unreadable`, so a user's broken
download gets the same one line, naming the file, from every target and command.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.fileio import read_user_file

TFLITE_MAGIC = b"TFL3"
SIGNATURE = "serving_default"
"""The one signature a policy file has: `observations` in, `action` and `q_values` out."""
COUNTS = {"decode": 0, "pack": 0}
"""How many times a flatbuffer was decoded into an object tree and packed back (tests count them)."""

_ITEM_BYTES = {"FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "BOOL": 1, "INT16": 2,
               "INT8": 1, "FLOAT64": 8, "UINT64": 8, "UINT32": 4, "UINT16": 2}


def unreadable(label: str, reason: str) -> UserError:
    """The one error for a file that is not a readable TFLite policy: names the file, says why, what to do."""
    reason = (reason.strip().splitlines() or ["unreadable"])[0][:160]
    return UserError(f"{label}: not a readable TFLite model ({reason}); is it truncated or damaged? "
                     "Re-export the policy")


def read_tflite(source: str | Path | bytes) -> tuple[bytes, str]:
    """A .tflite file's bytes (or the bytes given), checked to be a TFLite flatbuffer, and a label
    (the path) for messages."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, label = bytes(source), "<bytes>"
    else:
        label = str(source)
        data = read_user_file(source, "a .tflite file (or a SavedModel dir where one is accepted)")
    if len(data) < 8:
        raise UserError(f"{label}: empty or truncated TFLite data ({len(data)} bytes); re-export the policy")
    if data[4:8] != TFLITE_MAGIC:
        raise UserError(f"{label}: not a TFLite flatbuffer (no TFL3 identifier); pass a .tflite file written by compress-dqn")
    return data, label


def litert_schema() -> Any:
    """LiteRT's generated flatbuffer schema (the object API every edit uses)."""
    from ai_edge_litert import schema_py_generated as schema

    return schema


def read_metadata(data: bytes, name: str) -> bytes | None:
    """The bytes of metadata entry `name`, or None where the model has none (read in place: no decode of the
    whole file, as the LiteRT loader asks this of every policy it opens)."""
    schema = litert_schema()
    model = schema.Model.GetRootAs(data, 0)
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        if entry.Name() is not None and entry.Name().decode() == name:
            return model.Buffers(entry.Buffer()).DataAsNumpy().tobytes()
    return None


def decode(data: bytes, label: str, schema: Any = None) -> Any:
    """The flatbuffer as a schema ModelT (LiteRT's schema unless another is given), its indices checked:
    a truncated or damaged file is refused here, not later as a struct.error or a crash in a runtime."""
    schema = schema or litert_schema()
    COUNTS["decode"] += 1
    try:
        model = schema.ModelT.InitFromPackedBuf(bytearray(data), 0)  # touches every field: a cut file fails here
        if not model.subgraphs:
            raise ValueError("no subgraphs")
        problem = index_problem(model, schema)
    except Exception as exc:  # the Python flatbuffer reader raises many types on damaged data
        raise unreadable(label, _why(exc)) from None
    if problem:  # neither TFLM nor the graph reader verifies the flatbuffer: a bad index would crash or mislead
        raise unreadable(label, problem)
    return model


def _why(exc: Exception) -> str:
    """What a flatbuffer reader's exception says about the file, in words."""
    if isinstance(exc, struct.error):
        return "a field points past the end of the data"
    return f"a field holds an invalid value: {type(exc).__name__}"


def pack(model: Any, size_hint: int) -> bytes:
    """A schema ModelT packed as a .tflite flatbuffer (with its TFL3 identifier)."""
    import flatbuffers

    COUNTS["pack"] += 1
    builder = flatbuffers.Builder(size_hint + 1024)
    builder.Finish(model.Pack(builder), file_identifier=TFLITE_MAGIC)
    return bytes(builder.Output())


def builtin(code: Any) -> int:
    """An operator code's builtin op number (newer files keep it in builtinCode, older in the deprecated field)."""
    return max(int(code.builtinCode), int(code.deprecatedBuiltinCode))


def op_names(schema: Any) -> dict[int, str]:
    """Builtin op number -> name (FULLY_CONNECTED, ...), from the schema."""
    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def index_problem(model: Any, schema: Any) -> str | None:
    """The first out-of-range index or short constant buffer, which TFLM (no verifier) would follow."""
    types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    n_buffers, n_codes = len(model.buffers or []), len(model.operatorCodes or [])
    for g, graph in enumerate(model.subgraphs):
        tensors = graph.tensors or []
        n = len(tensors)
        for t, tensor in enumerate(tensors):
            if not 0 <= tensor.buffer < max(n_buffers, 1):
                return f"tensor {t} names buffer {tensor.buffer} of {n_buffers}"
            if tensor.type not in types:
                return f"tensor {t} has unknown type {tensor.type}"
            shape = [int(d) for d in (tensor.shape if tensor.shape is not None else [])]
            if any(d < 0 for d in shape):
                return f"tensor {t} has shape {shape}"
            data = model.buffers[tensor.buffer].data if n_buffers else None
            size = _ITEM_BYTES.get(types.get(tensor.type, ""))
            dense = tensor.sparsity is None  # a sparse-format tensor holds only its nonzero blocks
            if dense and data is not None and len(data) and size and len(data) < size * int(np.prod(shape, dtype=np.int64)):
                return f"tensor {t} holds {len(data)} bytes for shape {shape}"
        for i, op in enumerate(graph.operators or []):
            if not 0 <= op.opcodeIndex < n_codes:
                return f"operator {i} names op code {op.opcodeIndex} of {n_codes}"
            ins = list(op.inputs if op.inputs is not None else [])
            outs = list(op.outputs if op.outputs is not None else [])
            if any(not -1 <= int(x) < n for x in ins) or any(not 0 <= int(x) < n for x in outs):
                return f"operator {i} of subgraph {g} names a tensor beyond its {n}"
        for x in [*(graph.inputs if graph.inputs is not None else []), *(graph.outputs if graph.outputs is not None else [])]:
            if not 0 <= int(x) < n:
                return f"subgraph {g} input/output {int(x)} beyond its {n} tensors"
    for sig in model.signatureDefs or []:
        if not 0 <= sig.subgraphIndex < len(model.subgraphs):
            return f"signature names subgraph {sig.subgraphIndex}"
        n = len(model.subgraphs[sig.subgraphIndex].tensors or [])
        if any(not 0 <= m.tensorIndex < n for m in [*(sig.inputs or []), *(sig.outputs or [])]):
            return "signature names a tensor out of range"
    return None
