"""Loading and inspecting a policy for TensorFlow Lite Micro (TFLM): its ops, a checked flatbuffer, an interpreter.

Nothing here imports TensorFlow; `tflite_micro` is imported only when a function needs it.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.file import TFLiteFile
from compress_dqn.deploy.tflite.reader import SIGNATURE, builtin, op_names, unreadable
from compress_dqn.errors import UserError

INSTALL_HINT = "TFLite Micro is not installed; run: pip install 'compress-dqn[micro]'"

# Builtin op (schema name) -> the tflite::MicroMutableOpResolver method that registers it, from
# tensorflow/lite/micro/micro_mutable_op_resolver.h. An op missing here is one TFLM lacks.
RESOLVER_METHODS: dict[str, str] = {
    "ABS": "AddAbs", "ADD": "AddAdd", "ADD_N": "AddAddN", "ARG_MAX": "AddArgMax", "ARG_MIN": "AddArgMin",
    "ASSIGN_VARIABLE": "AddAssignVariable", "AVERAGE_POOL_2D": "AddAveragePool2D",
    "BATCH_MATMUL": "AddBatchMatMul", "BATCH_TO_SPACE_ND": "AddBatchToSpaceNd",
    "BROADCAST_ARGS": "AddBroadcastArgs", "BROADCAST_TO": "AddBroadcastTo", "CALL_ONCE": "AddCallOnce",
    "CAST": "AddCast", "CEIL": "AddCeil", "CONCATENATION": "AddConcatenation", "CONV_2D": "AddConv2D",
    "COS": "AddCos", "CUMSUM": "AddCumSum", "DEPTH_TO_SPACE": "AddDepthToSpace",
    "DEPTHWISE_CONV_2D": "AddDepthwiseConv2D", "DEQUANTIZE": "AddDequantize", "DIV": "AddDiv",
    "DYNAMIC_UPDATE_SLICE": "AddDynamicUpdateSlice", "EMBEDDING_LOOKUP": "AddEmbeddingLookup",
    "ELU": "AddElu", "EQUAL": "AddEqual", "EXP": "AddExp", "EXPAND_DIMS": "AddExpandDims", "FILL": "AddFill",
    "FLOOR": "AddFloor", "FLOOR_DIV": "AddFloorDiv", "FLOOR_MOD": "AddFloorMod",
    "FULLY_CONNECTED": "AddFullyConnected", "GATHER": "AddGather", "GATHER_ND": "AddGatherNd",
    "GREATER": "AddGreater", "GREATER_EQUAL": "AddGreaterEqual", "HARD_SWISH": "AddHardSwish", "IF": "AddIf",
    "L2_NORMALIZATION": "AddL2Normalization", "L2_POOL_2D": "AddL2Pool2D", "LEAKY_RELU": "AddLeakyRelu",
    "LESS": "AddLess", "LESS_EQUAL": "AddLessEqual", "LOG": "AddLog", "LOGICAL_AND": "AddLogicalAnd",
    "LOGICAL_NOT": "AddLogicalNot", "LOGICAL_OR": "AddLogicalOr", "LOGISTIC": "AddLogistic",
    "LOG_SOFTMAX": "AddLogSoftmax", "MAXIMUM": "AddMaximum", "MAX_POOL_2D": "AddMaxPool2D",
    "MIRROR_PAD": "AddMirrorPad", "MEAN": "AddMean", "MINIMUM": "AddMinimum", "MUL": "AddMul", "NEG": "AddNeg",
    "NOT_EQUAL": "AddNotEqual", "PACK": "AddPack", "PAD": "AddPad", "PADV2": "AddPadV2", "PRELU": "AddPrelu",
    "QUANTIZE": "AddQuantize", "READ_VARIABLE": "AddReadVariable", "REDUCE_ALL": "AddReduceAll",
    "REDUCE_MAX": "AddReduceMax", "REDUCE_MIN": "AddReduceMin", "RELU": "AddRelu", "RELU6": "AddRelu6",
    "RESHAPE": "AddReshape", "RESIZE_BILINEAR": "AddResizeBilinear",
    "RESIZE_NEAREST_NEIGHBOR": "AddResizeNearestNeighbor", "REVERSE_V2": "AddReverseV2", "ROUND": "AddRound",
    "RSQRT": "AddRsqrt", "SELECT_V2": "AddSelectV2", "SHAPE": "AddShape", "SIN": "AddSin", "SLICE": "AddSlice",
    "SOFTMAX": "AddSoftmax", "SPACE_TO_BATCH_ND": "AddSpaceToBatchNd", "SPACE_TO_DEPTH": "AddSpaceToDepth",
    "SPLIT": "AddSplit", "SPLIT_V": "AddSplitV", "SQUEEZE": "AddSqueeze", "SQRT": "AddSqrt",
    "SQUARE": "AddSquare", "SQUARED_DIFFERENCE": "AddSquaredDifference", "STRIDED_SLICE": "AddStridedSlice",
    "SUB": "AddSub", "SUM": "AddSum", "SVDF": "AddSvdf", "TANH": "AddTanh", "TRANSPOSE_CONV": "AddTransposeConv",
    "TRANSPOSE": "AddTranspose", "UNPACK": "AddUnpack",
    "UNIDIRECTIONAL_SEQUENCE_LSTM": "AddUnidirectionalSequenceLSTM", "VAR_HANDLE": "AddVarHandle",
    "WHILE": "AddWhile", "ZEROS_LIKE": "AddZerosLike",
    # Custom ops TFLM ships; TFLM_DECODE decompresses LUT-compressed weights (see try_compression).
    "TFLM_DECODE": "AddDecode", "TFLite_Detection_PostProcess": "AddDetectionPostprocess",
}



def tflm_runtime() -> Any:
    """The tflite_micro.runtime module, or the one-line install hint."""
    try:
        from tflite_micro import runtime
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return runtime


def aligned(model_bytes: bytes) -> bytes:
    """Repack with the schema's force_align honoured (the Python flatbuffers builder ignores it)."""
    from tflite_micro.tensorflow.lite.micro.tools import tflite_flatbuffer_align_wrapper

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.tflite", Path(tmp) / "out.tflite"
        src.write_bytes(model_bytes)
        tflite_flatbuffer_align_wrapper.align_tflite_model(str(src), str(dst))
        return dst.read_bytes()


def available() -> bool:
    """Whether the tflite-micro package can be imported (tests and callers skip on False)."""
    try:
        tflm_runtime()
    except UserError:
        return False
    return True


@dataclass
class ModelInfo:
    """What the flatbuffer says, before any interpreter runs it."""

    ops: list[str]
    """Operator names in order of first use (builtin schema names, or the custom code)."""
    missing: list[str]
    """Ops TFLM has no kernel for."""
    outputs: dict[str, int] = field(default_factory=dict)
    """Signature output name -> position in the subgraph's outputs (interpreter.get_output index)."""
    n_inputs: int = 0


def tflm_schema() -> Any:
    """The flatbuffer schema TFLM ships (its object API)."""
    tflm_runtime()
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    return schema


def decoded(data: bytes, label: str = "<bytes>") -> TFLiteFile:
    """The file decoded once with TFLM's schema; a truncated or damaged file, which TFLM would follow unchecked, refused."""
    return TFLiteFile.decode(data, label, tflm_schema())


def inspect_model(source: bytes | TFLiteFile, label: str = "<bytes>") -> ModelInfo:
    """Ops and the serving signature, read with the flatbuffer schema TFLM ships (no interpreter);
    a file already decoded (`decoded`) is read as it is."""
    file = source if isinstance(source, TFLiteFile) else decoded(source, label)
    schema, model, label = file.schema, file.model, file.label
    names = op_names(schema)
    try:
        graph = model.subgraphs[0]
        ops: list[str] = []
        for op in (op for g in model.subgraphs for op in g.operators or []):
            code = model.operatorCodes[op.opcodeIndex]
            number = builtin(code)
            name = code.customCode.decode() if number == schema.BuiltinOperator.CUSTOM else names.get(number, f"BUILTIN_{number}")
            if name not in ops:
                ops.append(name)
        outputs: dict[str, int] = {}
        graph_outputs = [int(i) for i in (graph.outputs if graph.outputs is not None else [])]
        for sig in model.signatureDefs or []:
            if sig.signatureKey.decode() == SIGNATURE:
                for out in sig.outputs or []:
                    if out.tensorIndex in graph_outputs:
                        outputs[out.name.decode()] = graph_outputs.index(out.tensorIndex)
        n_inputs = len(graph.inputs if graph.inputs is not None else [])
    except Exception as exc:  # damaged names or signatures
        raise unreadable(label, type(exc).__name__) from None
    missing = [op for op in ops if op not in RESOLVER_METHODS]
    return ModelInfo(ops=ops, missing=missing, outputs=outputs, n_inputs=n_inputs)


def refuse_missing(info: ModelInfo, label: str) -> None:
    if "DENSIFY" in info.missing:  # the converter's sparse weight format, expanded at load
        raise UserError(f"{label}: its pruned weights are in TFLite's sparse format, whose DENSIFY op "
                        "TFLite Micro has no kernel for: set the variant's prune.sparse_format: false "
                        "(or convert without Optimize.EXPERIMENTAL_SPARSITY)")
    if info.missing:
        raise UserError(f"{label}: TFLite Micro has no kernel for op {', '.join(info.missing)}; "
                        "it cannot run on a microcontroller: export the policy without it")


@contextlib.contextmanager
def native_stderr() -> Iterator[list[str]]:
    """Capture what TFLM's C++ prints on fd 2 (errors, allocation records) into the yielded list."""
    lines: list[str] = []
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield lines
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines.extend(tmp.read().decode("utf-8", "replace").splitlines())


def failure_reason(lines: list[str], exc: Exception) -> str:
    """One line from TFLM's own messages: which op failed and why."""
    text = [line.strip() for line in lines if line.strip()]
    node = next((line for line in text if line.startswith("Node ")), None)
    missing = next((line for line in text if "Didn't find op" in line or "unsupported op" in line.lower()), None)
    if missing:
        return missing
    if node:
        op = node.split()[1]
        detail = text[text.index(node) - 1] if text.index(node) > 0 else ""
        detail = re.sub(r"^\S+\.cc:\d+ ", "", detail)
        hint = ""
        if "filter type" in detail or "DEQUANTIZE" == op:
            hint = " (dynamic-range, weight-only and float16 models do not run on TFLM: use quantize: {mode: int8} or fp32)"
        return f"TFLite Micro cannot prepare op {op}: {detail}{hint}".rstrip(": ")
    return text[-1] if text else str(exc).splitlines()[0]


def generous_arena(data: bytes) -> int:
    return max(10 * len(data), 64 * 1024)


def new_interpreter(data: bytes, arena: int, label: str) -> Any:
    """A TFLM interpreter over data, or a UserError naming what TFLM refused."""
    runtime = tflm_runtime()
    with native_stderr() as lines:
        try:
            interp = runtime.Interpreter.from_bytes(data, arena_size=int(arena))
            error = None
        except Exception as exc:  # RuntimeError from TFLM; others from its flatbuffer reader
            interp, error = None, exc
    if error is not None:
        raise UserError(f"{label}: {failure_reason(lines, error)}")
    return interp


def invoke_zeros(interp: Any, n_inputs: int) -> None:
    for i in range(n_inputs):
        details = interp.get_input_details(i)
        interp.set_input(np.zeros(details["shape"], details["dtype"]), i)
    interp.invoke()

