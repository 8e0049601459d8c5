"""Microcontroller deployment with TensorFlow Lite Micro (TFLM): measured flash and RAM, C++ export.

Figures here are measured with TFLM's own Python interpreter (the `tflite-micro` package), not
estimated: flash is the length of the model array, RAM is the smallest tensor arena with which
TFLM allocates and invokes the model (found by bisection; 64-bit host, reference kernels). A
32-bit target needs somewhat less (its structs hold 4-byte pointers), optimized kernels such as
CMSIS-NN may ask for scratch buffers the reference ones do not, hence the stated margin.

`MicroPolicy` plays episodes through that interpreter with `TFLitePolicy`'s interface, so the
returns a device would get can be checked on the host. On int8 policies its actions equal LiteRT's
builtin kernels bit for bit, not always XNNPACK's (LiteRT's default), which requantizes in float
and can round a small action gap the other way. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.deploy.policy import read_tflite
from compress_dqn.deploy.tflite_metadata import input_normalization
from compress_dqn.fileio import write_bytes_atomic, write_text_atomic

INSTALL_HINT = "TFLite Micro is not installed; run: pip install 'compress-dqn[micro]'"
SIGNATURE = "serving_default"
RAM_BUDGETS = {"32KB": 32 * 1024, "256KB": 256 * 1024}
ARENA_MARGIN = 0.25
"""Margin on the measured arena: 25%, at least 1 KiB (kernel scratch buffers differ per port)."""
ARENA_MARGIN_MIN = 1024

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


# --------------------------------------------------------------------------------------------
# Loading and inspecting a model


def _tflm() -> Any:
    """The tflite_micro.runtime module, or the one-line install hint."""
    try:
        from tflite_micro import runtime
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    return runtime


def available() -> bool:
    """Whether the tflite-micro package can be imported (tests and callers skip on False)."""
    try:
        _tflm()
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


def inspect_model(data: bytes, label: str = "<bytes>") -> ModelInfo:
    """Ops and the serving signature, read with the flatbuffer schema TFLM ships (no interpreter)."""
    _tflm()
    from tflite_micro.tensorflow.lite.micro.python import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    try:
        model = schema.ModelT.InitFromPackedBuf(data, 0)  # touches every field: a truncated file fails here
        if not model.subgraphs:
            raise ValueError("no subgraphs")
        graph = model.subgraphs[0]
        ops: list[str] = []
        for op in (op for g in model.subgraphs for op in g.operators or []):
            code = model.operatorCodes[op.opcodeIndex]
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            name = code.customCode.decode() if builtin == schema.BuiltinOperator.CUSTOM else names.get(builtin, f"BUILTIN_{builtin}")
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
        problem = _index_problem(model, schema)
    except Exception as exc:  # the Python flatbuffer reader raises many types on damaged data
        raise UserError(f"{label}: not a readable TFLite model ({type(exc).__name__}); is it truncated or damaged?") from None
    if problem:  # TFLM does not verify the flatbuffer: a bad index would crash it, not fail
        raise UserError(f"{label}: damaged TFLite model ({problem}); re-export the policy")
    missing = [op for op in ops if op not in RESOLVER_METHODS]
    return ModelInfo(ops=ops, missing=missing, outputs=outputs, n_inputs=n_inputs)


_ITEM_BYTES = {"FLOAT32": 4, "FLOAT16": 2, "INT32": 4, "UINT8": 1, "INT64": 8, "BOOL": 1, "INT16": 2,
               "INT8": 1, "FLOAT64": 8, "UINT64": 8, "UINT32": 4, "UINT16": 2}


def _index_problem(model: Any, schema: Any) -> str | None:
    """The first out-of-range index or short constant buffer, which TFLM (no verifier) would follow."""
    types = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    n_buffers, n_codes = len(model.buffers or []), len(model.operatorCodes or [])
    for g, graph in enumerate(model.subgraphs):
        tensors = graph.tensors or []
        n = len(tensors)
        for t, tensor in enumerate(tensors):
            if not 0 <= tensor.buffer < max(n_buffers, 1):
                return f"tensor {t} names buffer {tensor.buffer} of {n_buffers}"
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


def _refuse_missing(info: ModelInfo, label: str) -> None:
    if "DENSIFY" in info.missing:  # the converter's sparse weight format, expanded at load
        raise UserError(f"{label}: its pruned weights are in TFLite's sparse format, whose DENSIFY op "
                        "TFLite Micro has no kernel for: set the variant's prune.sparse_format: false "
                        "(or convert without Optimize.EXPERIMENTAL_SPARSITY)")
    if info.missing:
        raise UserError(f"{label}: TFLite Micro has no kernel for op {', '.join(info.missing)}; "
                        "it cannot run on a microcontroller: export the policy without it")


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
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


def _failure_reason(lines: list[str], exc: Exception) -> str:
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
            hint = " (dynamic-range and float16 models do not run on TFLM: use quantize: {mode: int8} or fp32)"
        return f"TFLite Micro cannot prepare op {op}: {detail}{hint}".rstrip(": ")
    return text[-1] if text else str(exc).splitlines()[0]


def _generous_arena(data: bytes) -> int:
    return max(10 * len(data), 64 * 1024)


def _interpreter(data: bytes, arena: int, label: str) -> Any:
    """A TFLM interpreter over data, or a UserError naming what TFLM refused."""
    runtime = _tflm()
    with _native_stderr() as lines:
        try:
            interp = runtime.Interpreter.from_bytes(data, arena_size=int(arena))
            error = None
        except Exception as exc:  # RuntimeError from TFLM; others from its flatbuffer reader
            interp, error = None, exc
    if error is not None:
        raise UserError(f"{label}: {_failure_reason(lines, error)}")
    return interp


def _invoke_zeros(interp: Any, n_inputs: int) -> None:
    for i in range(n_inputs):
        details = interp.get_input_details(i)
        interp.set_input(np.zeros(details["shape"], details["dtype"]), i)
    interp.invoke()


class _ArenaProbe:
    """Tries arena sizes in a child process: TFLM can crash (not fail) on an arena a little too small.

    One worker takes sizes on stdin and answers 1 or 0 per size; a crash or a hang counts as 0
    and a fresh worker takes the next size, so the caller never dies with it.
    """

    TIMEOUT_S = 60.0

    def __init__(self, data: bytes, n_inputs: int) -> None:
        self._n_inputs = n_inputs
        self._file = tempfile.NamedTemporaryFile(suffix=".tflite", delete=False)
        self._file.write(data)
        self._file.close()
        self._proc: Any = None

    def _start(self) -> None:
        import subprocess

        code = "from compress_dqn.deploy.micro import _probe_worker; _probe_worker()"
        package_root = str(Path(__file__).resolve().parent.parent)  # importable even when not installed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-c", code, self._file.name, str(self._n_inputs)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, bufsize=1)

    def runs(self, arena: int) -> bool:
        import select

        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            self._proc.stdin.write(f"{int(arena)}\n")
            self._proc.stdin.flush()
            ready, _, _ = select.select([self._proc.stdout], [], [], self.TIMEOUT_S)
            answer = self._proc.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            answer = ""
        if answer.strip() in ("0", "1"):
            return answer.strip() == "1"
        self._stop()  # crashed or hung on this size
        return False

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._proc = None

    def close(self) -> None:
        self._stop()
        with contextlib.suppress(OSError):
            os.unlink(self._file.name)


def _probe_worker() -> None:
    """Child side of _ArenaProbe: argv[1] is the model file, argv[2] its input count; one size per line."""
    runtime = _tflm()
    data, n_inputs = Path(sys.argv[1]).read_bytes(), int(sys.argv[2])
    for line in sys.stdin:
        try:
            _invoke_zeros(runtime.Interpreter.from_bytes(data, arena_size=int(line)), n_inputs)
            ok = True
        except Exception:
            ok = False
        print(1 if ok else 0, flush=True)


def measure_arena(data: bytes, label: str = "<bytes>", info: ModelInfo | None = None) -> dict[str, int]:
    """The smallest tensor arena with which TFLM allocates and invokes the model, in bytes.

    The allocation recorder's total is a lower bound (it leaves out the allocator's own objects and
    temporaries freed during Prepare); bisection from there to a size that works gives the number
    a device build actually needs with the same kernels.
    """
    info = info or inspect_model(data, label)
    _refuse_missing(info, label)
    interp = _interpreter(data, _generous_arena(data), label)
    with _native_stderr() as lines:
        try:
            _invoke_zeros(interp, info.n_inputs)
            failed = None
        except Exception as exc:
            failed = exc
        if failed is None:
            interp.print_allocations()
    if failed is not None:
        raise UserError(f"{label}: {_failure_reason(lines, failed)}")
    recorded = next((int(m.group(1)) for line in lines if (m := re.search(r"allocation total (\d+) bytes", line))), 0)
    probe = _ArenaProbe(data, info.n_inputs)
    try:
        low, step = max(recorded, 1), 256
        if probe.runs(low):
            return {"arena_bytes": low, "recorded_bytes": recorded}
        high = low + step
        while not probe.runs(high):  # the recorder's total plus a little, doubling
            low, step = high, step * 2
            high = min(low + step, _generous_arena(data))
            if low >= _generous_arena(data):
                raise UserError(f"{label}: TFLite Micro did not run it in any arena up to {low} bytes")
        while high - low > 1:  # invariant: low fails, high works
            mid = (low + high) // 2
            low, high = (low, mid) if probe.runs(mid) else (mid, high)
    finally:
        probe.close()
    return {"arena_bytes": high, "recorded_bytes": recorded}


def with_margin(arena_bytes: int) -> int:
    """The arena to allocate on a device: measured + 25% (at least 1 KiB), a multiple of 16."""
    padded = arena_bytes + max(math.ceil(arena_bytes * ARENA_MARGIN), ARENA_MARGIN_MIN)
    return -(-padded // 16) * 16


def micro_summary(tflite_path_or_bytes: str | Path | bytes) -> dict[str, Any]:
    """Whether TFLM runs this policy and what it costs; never raises for a model it cannot run.

    Returns {"runs", "arena_bytes" (measured; None when it does not run), "arena_bytes_with_margin",
    "flash_bytes" (the model array's length; the TFLM library's code is extra), "ops", "reason",
    "fits": {"32KB", "256KB"}} where fits compares the arena with margin against those RAM budgets.
    """
    result: dict[str, Any] = {"runs": False, "arena_bytes": None, "arena_bytes_with_margin": None,
                              "flash_bytes": 0, "ops": [], "reason": None,
                              "fits": {budget: False for budget in RAM_BUDGETS}}
    try:
        data, label = read_tflite(tflite_path_or_bytes)
        result["flash_bytes"] = len(data)
        info = inspect_model(data, label)
        result["ops"] = info.ops
        arena = measure_arena(data, label, info)["arena_bytes"]
    except UserError as exc:
        result["reason"] = str(exc)
        return result
    except Exception as exc:  # a report must not die on one artifact: say what went wrong instead
        result["reason"] = f"measuring it failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        return result
    padded = with_margin(arena)
    result.update(runs=True, arena_bytes=arena, arena_bytes_with_margin=padded,
                  fits={budget: padded <= size for budget, size in RAM_BUDGETS.items()})
    return result


# --------------------------------------------------------------------------------------------
# Playing through the TFLM interpreter


class MicroPolicy:
    """A .tflite policy run by the TFLite Micro interpreter, batch 1, as a microcontroller runs it.

    Same interface as `compress_dqn.deploy.policy.TFLitePolicy`: obs_shape, n_actions, q_values(batch),
    actions(batch), act(obs). Batches are played one observation at a time (TFLM shapes are fixed).
    """

    def __init__(self, path: str | Path | bytes, arena_bytes: int | None = None) -> None:
        data, label = read_tflite(path)
        info = inspect_model(data, label)
        _refuse_missing(info, label)
        if info.n_inputs != 1 or not {"q_values", "action"} <= set(info.outputs):
            raise UserError(f"{label}: signature {SIGNATURE!r} maps {info.n_inputs} input(s) -> {sorted(info.outputs)}; "
                            "expected one observation input -> q_values, action (export it with compress-dqn)")
        self._data = data  # TFLM reads the flatbuffer in place: keep it alive
        self._interp = _interpreter(data, arena_bytes or _generous_arena(data), label)
        self.ops = info.ops
        details = self._interp.get_input_details(0)
        self._shape = tuple(int(d) for d in details["shape"])
        self.obs_shape = self._shape[1:]
        self.input_dtype = np.dtype(details["dtype"])
        self.input_quantization = _quant(details)
        self._quantized_input = self.input_quantization is not None and self.input_dtype.kind in "iu"
        self.input_normalization = input_normalization(data, label, features=int(np.prod(self.obs_shape)))  # (mean, std) or None
        self._q_index, self._action_index = info.outputs["q_values"], info.outputs["action"]
        q_details = self._interp.get_output_details(self._q_index)
        self.n_actions = int(q_details["shape"][-1])
        self.q_quantization = _quant(q_details)
        self._set, self._invoke, self._get = self._interp.set_input, self._interp.invoke, self._interp.get_output
        with _native_stderr() as lines:  # one invoke now: a model TFLM cannot run fails here, in one line
            try:
                self._run(np.zeros(self.obs_shape, np.float32))
                error = None
            except Exception as exc:
                error = exc
        if error is not None:
            raise UserError(f"{label}: {_failure_reason(lines, error)}")

    def _prepare(self, obs: np.ndarray) -> np.ndarray:
        if self.input_normalization is not None:  # as TFLitePolicy does: the model takes (obs - mean) / std
            mean, std = self.input_normalization
            obs = (np.asarray(obs, np.float32).reshape(-1, mean.size) - mean) / std
        if self._quantized_input:  # as TFLitePolicy does, so both runtimes see the same integers
            scale, zero_point = self.input_quantization
            info = np.iinfo(self.input_dtype)
            obs = np.clip(np.round(np.asarray(obs, np.float32) / scale + zero_point), info.min, info.max)
        return np.ascontiguousarray(np.asarray(obs).reshape(self._shape), dtype=self.input_dtype)

    def _run(self, obs: np.ndarray) -> None:
        self._set(self._prepare(obs), 0)
        self._invoke()

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        rows = []
        for one in np.asarray(obs):
            self._run(one)
            rows.append(np.array(self._get(self._q_index)).reshape(-1))
        q = np.stack(rows) if rows else np.zeros((0, self.n_actions))
        if self.q_quantization is not None and q.dtype.kind in "iu":
            scale, zero_point = self.q_quantization
            q = (q.astype(np.float32) - zero_point) * scale
        return np.asarray(q, dtype=np.float32)

    def actions(self, obs: np.ndarray) -> np.ndarray:
        """The greedy actions for a batch (the `action` output, which is what the device plays)."""
        out = []
        for one in np.asarray(obs):
            self._run(one)
            out.append(int(self._get(self._action_index).reshape(-1)[0]))
        return np.array(out, dtype=np.int32)

    def act(self, obs: np.ndarray) -> int:
        self._run(obs)
        return int(self._get(self._action_index).reshape(-1)[0])


def _quant(details: dict) -> tuple[float, int] | None:
    """Per-tensor (scale, zero point) of an io tensor, or None for a float one."""
    params = details.get("quantization_parameters") or {}
    scales, zero_points = params.get("scales", []), params.get("zero_points", [])
    if len(scales) == 0 or float(scales[0]) == 0.0:
        return None
    return float(scales[0]), int(zero_points[0]) if len(zero_points) else 0


# --------------------------------------------------------------------------------------------
# Rewriting: int8 io, TFLM weight compression


def _editor() -> Any:
    _tflm()
    from tflite_micro.tensorflow.lite.micro.compression import model_editor

    return model_editor


def _aligned(model_bytes: bytes) -> bytes:
    """Repack with the schema's force_align honoured (the Python flatbuffers builder ignores it)."""
    from tflite_micro.tensorflow.lite.micro.tools import tflite_flatbuffer_align_wrapper

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.tflite", Path(tmp) / "out.tflite"
        src.write_bytes(model_bytes)
        tflite_flatbuffer_align_wrapper.align_tflite_model(str(src), str(dst))
        return dst.read_bytes()


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
        """Drop the QUANTIZE after a float observation input."""
        obs = self.graph.inputs[0]
        if obs.dtype == self.types.FLOAT32:
            users = self.graph.consumers_of(obs)
            if len(users) != 1 or users[0].opcode != self.ops.QUANTIZE or users[0].outputs[0].dtype != self.types.INT8:
                raise UserError(f"{self.label}: its float input is not quantized to int8 first (a float model?); {_INT8_IO_HINT}")
            self.replace[id(obs)] = users[0].outputs[0]
            self.dropped.append(users[0])
        elif obs.dtype != self.types.INT8:
            raise UserError(f"{self.label}: its input is {_type_name(self.schema, obs.dtype)}, not float32 or int8; "
                            "--int8-io cannot rewrite it")

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
    input and the DEQUANTIZE before the float q_values, as the TFLite converter does for
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
    return _aligned(bytes(model.build()))


def _type_name(schema: Any, code: int) -> str:
    return {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}.get(code, str(code)).lower()


@dataclass
class Compression:
    """Outcome of trying TFLM's look-up-table weight compression on a model."""

    data: bytes | None
    """The compressed model, or None when it is not worth keeping."""
    flash_bytes: int | None
    """Its size when one could be built (kept or not)."""
    reason: str
    tensors: int = 0
    arena_bytes: int | None = None
    """Measured arena of the compressed model: decoded weights live in RAM, so it grows."""


def try_compression(data: bytes, label: str = "<bytes>") -> Compression:
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
            if tensor.buffer is None or len(tensor.buffer.data) == 0 or tensor.array is None:
                continue
            plan = _lut_plan(tensor)
            if plan is not None:
                bits, mode = plan
                builder.add_tensor(subgraph=g, tensor=t).with_lut(
                    index_bitwidth=bits, mode=cspec.PerTensor() if mode is None else cspec.PerChannel(axis=mode))
                chosen += 1
    if not chosen:
        return Compression(None, None, "no weight tensor has 128 or fewer distinct values (int8 weights use up to "
                           "255): a look-up table would make it larger; cluster the weights first", 0)
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            packed = bytes(compression.compress(data, builder.build()))
    except Exception as exc:  # CompressionError or a tensor the compressor cannot take
        return Compression(None, None, f"TFLM's compressor refused it ({str(exc).splitlines()[0]})", chosen)
    if len(packed) >= len(data):
        return Compression(None, len(packed), f"compressed model is not smaller ({len(packed)} >= {len(data)} bytes)", chosen)
    try:
        same = _same_outputs(data, packed, label)
    except UserError as exc:
        return Compression(None, len(packed), f"TFLM cannot run the compressed model ({exc})", chosen)
    if not same:
        return Compression(None, len(packed), "compressed model's outputs differ from the original's", chosen)
    arena = measure_arena(packed, label)["arena_bytes"]
    return Compression(packed, len(packed), f"{chosen} tensor(s) LUT-compressed, outputs identical; decoded "
                       f"weights need {arena} bytes of arena", chosen, arena)


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


def _probe_observations(policy: MicroPolicy, n: int = 256) -> np.ndarray:
    rng = np.random.default_rng(0)
    if policy._quantized_input:  # every point of the input grid is a valid observation
        scale, zero_point = policy.input_quantization
        info = np.iinfo(policy.input_dtype)
        return ((rng.integers(info.min, info.max + 1, size=(n, *policy.obs_shape)) - zero_point) * scale).astype(np.float32)
    if policy.input_dtype.kind in "iu":  # raw integer observations (pixels)
        return rng.integers(0, 256, size=(n, *policy.obs_shape)).astype(policy.input_dtype)
    return rng.normal(0, 2, size=(n, *policy.obs_shape)).astype(np.float32)


def _same_outputs(original: bytes, candidate: bytes, label: str) -> bool:
    """Whether TFLM gives identical q-values and actions for both models on probe observations."""
    before, after = MicroPolicy(original), MicroPolicy(candidate)
    if before.obs_shape != after.obs_shape or before.n_actions != after.n_actions:
        return False
    obs = _probe_observations(before)
    return bool(np.array_equal(before.q_values(obs), after.q_values(obs))
                and np.array_equal(before.actions(obs), after.actions(obs)))


# --------------------------------------------------------------------------------------------
# C++ export

_CPP_KEYWORDS = {"and", "auto", "bool", "break", "case", "char", "class", "const", "default", "delete", "do",
                 "double", "else", "enum", "float", "for", "if", "int", "long", "namespace", "new", "not", "or",
                 "private", "public", "return", "short", "signed", "static", "struct", "switch", "template",
                 "this", "tflite", "union", "unsigned", "using", "void", "while", "std"}


def c_name(name: str) -> str:
    """A C++ identifier from a policy or variant name (student-32x32-qat-int8 -> student_32x32_qat_int8)."""
    ident = re.sub(r"\W+", "_", name, flags=re.ASCII).strip("_").lower() or "policy"
    if ident[0].isdigit():
        ident = f"policy_{ident}"
    return f"{ident}_policy" if ident in _CPP_KEYWORDS else ident


def default_name(policy: Path) -> str:
    """The variant directory's name for runs/X/variants/NAME/policy.tflite, else the file's stem."""
    policy = Path(policy)
    return c_name(policy.parent.name if policy.stem == "policy" and policy.parent.name else policy.stem)


def _c_float(value: float) -> str:
    text = f"{np.float32(value).item():.9g}"
    return f"{text}f" if any(c in text for c in ".e") else f"{text}.0f"


_C_TYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t"}


def _array_lines(data: bytes) -> str:
    rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 12]) for i in range(0, len(data), 12)]
    return ",\n".join(f"    {row}" for row in rows)


@dataclass
class _Export:
    name: str
    data: bytes
    ops: list[str]
    arena: int
    recorded: int
    policy: MicroPolicy
    source: str
    compressed: bool


def _header(e: _Export) -> str:
    p = e.policy
    guard = f"{e.name.upper()}_MODEL_H_"
    lines = [
        f"// {e.name}: a DQN policy for TensorFlow Lite Micro, generated by compress-dqn from {e.source}.",
        "// Do not edit: rerun `compress-dqn export POLICY --target micro` instead.",
        f"#ifndef {guard}", f"#define {guard}", "", "#include <cstdint>", "", f"namespace {e.name} {{", "",
        "// The .tflite flatbuffer; const, so it stays in flash. TFLM needs it 16-byte aligned.",
        "alignas(16) extern const unsigned char model[];",
        f"constexpr unsigned int model_len = {len(e.data)};  // flash bytes for the model",
        "",
        f"// Tensor arena: {e.arena} bytes measured with the TFLM interpreter (64-bit host, reference",
        f"// kernels), plus a margin of 25% (at least {ARENA_MARGIN_MIN} bytes) for other kernel ports.",
        f"constexpr unsigned int arena_size = {with_margin(e.arena)};",
        f"constexpr unsigned int arena_measured = {e.arena};",
        "",
        f"// Ops ({len(e.ops)}): {', '.join(e.ops)}",
        f"constexpr int op_count = {len(e.ops)};",
        "",
        f"// One observation: shape {list(p.obs_shape)}, {p.input_dtype.name}.",
        f"constexpr int input_size = {int(np.prod(p.obs_shape))};",
        f"constexpr int num_actions = {p.n_actions};",
        f"constexpr int q_values_output = {p._q_index};  // interpreter.output(q_values_output)",
        f"constexpr int action_output = {p._action_index};  // int32 greedy action",
    ]
    if p.input_normalization is not None:
        mean, std = p.input_normalization
        lines += ["", "// The policy takes normalized observations: x = (observation - input_mean) / input_std",
                  "// per feature, before any input quantization below.",
                  f"constexpr float input_mean[{mean.size}] = {{{', '.join(_c_float(v) for v in mean)}}};",
                  f"constexpr float input_std[{std.size}] = {{{', '.join(_c_float(v) for v in std)}}};"]
    if p.input_quantization is not None:
        scale, zero_point = p.input_quantization
        lines += ["", f"// {p.input_dtype.name} input: q = clamp(round(x / input_scale) + input_zero_point).",
                  f"constexpr float input_scale = {_c_float(scale)};",
                  f"constexpr int input_zero_point = {zero_point};"]
    if p.q_quantization is not None:
        scale, zero_point = p.q_quantization
        lines += ["", "// int8 q_values: Q = (q - q_values_zero_point) * q_values_scale (the action needs neither).",
                  f"constexpr float q_values_scale = {_c_float(scale)};",
                  f"constexpr int q_values_zero_point = {zero_point};"]
    lines += ["", f"}}  // namespace {e.name}", "", f"#endif  // {guard}", ""]
    return "\n".join(lines)


def _model_cc(e: _Export) -> str:
    return (
        f"// {e.name}: the model flatbuffer ({len(e.data)} bytes), generated by compress-dqn from {e.source}.\n"
        f'#include "{e.name}_model.h"\n\n'
        f"namespace {e.name} {{\n\n"
        f"alignas(16) const unsigned char model[] = {{\n{_array_lines(e.data)}\n}};\n\n"
        "static_assert(sizeof(model) == model_len, \"model_len does not match the array\");\n\n"
        f"}}  // namespace {e.name}\n"
    )


def _example_cc(e: _Export) -> str:
    p, n = e.policy, e.name
    in_type = _C_TYPES.get(p.input_dtype.name, "float")
    field = {"float": "f", "int8_t": "int8", "uint8_t": "uint8", "int16_t": "i16", "int32_t": "i32"}[in_type]
    adds = "\n".join(f"  if (resolver.{RESOLVER_METHODS[op]}() != kTfLiteOk) return false;" for op in e.ops)
    compressed = ("// The model holds LUT-compressed weights (DECODE op): build TFLM with compression\n"
                  "// enabled (make ... USE_TFLM_COMPRESSION=1, or bazel --//:with_compression=true).\n") if e.compressed else ""
    return f"""\
// Example: run the {n} policy with TensorFlow Lite Micro. Generated by compress-dqn.
// Build it inside a TFLM project (https://github.com/tensorflow/tflite-micro) together with
// {n}_model.cc; define {n.upper()}_NO_MAIN to use only {n}_setup() and {n}_act().
{compressed}#include <cstdint>
#include <cstdio>
#include <cstring>

#include "tensorflow/lite/micro/micro_interpreter.h"
#include "tensorflow/lite/micro/micro_mutable_op_resolver.h"
#include "tensorflow/lite/schema/schema_generated.h"
#include "{n}_model.h"

namespace {{
// Measured {e.arena} bytes, plus margin; see {n}_model.h.
alignas(16) uint8_t tensor_arena[{n}::arena_size];
tflite::MicroInterpreter* interpreter = nullptr;
}}  // namespace

// Sets up the interpreter once; false if the model, an op or the arena is not right.
bool {n}_setup() {{
  // Exactly the {len(e.ops)} op(s) this model uses: unused kernels are not linked in.
  static tflite::MicroMutableOpResolver<{len(e.ops)}> resolver;
{adds}
  const tflite::Model* model = tflite::GetModel({n}::model);
  if (model->version() != TFLITE_SCHEMA_VERSION) return false;
  static tflite::MicroInterpreter static_interpreter(model, resolver, tensor_arena, {n}::arena_size);
  interpreter = &static_interpreter;
  return interpreter->AllocateTensors() == kTfLiteOk;
}}

// The greedy action for one observation of {n}::input_size {in_type} values, or -1 on error.
int {n}_act(const {in_type}* observation) {{
  TfLiteTensor* input = interpreter->input(0);
  std::memcpy(input->data.{field}, observation, sizeof({in_type}) * {n}::input_size);
  if (interpreter->Invoke() != kTfLiteOk) return -1;
  return static_cast<int>(interpreter->output({n}::action_output)->data.i32[0]);
}}

#ifndef {n.upper()}_NO_MAIN
int main() {{
  if (!{n}_setup()) {{
    std::printf("setup failed\\n");
    return 1;
  }}
  {in_type} observation[{n}::input_size] = {{}};
  int action = {n}_act(observation);
  std::printf("action %d, arena used %u of %u bytes\\n", action,
              static_cast<unsigned>(interpreter->arena_used_bytes()), {n}::arena_size);
  return action < 0;
}}
#endif
"""


def _readme(e: _Export, summary: dict[str, Any]) -> str:
    p, n = e.policy, e.name
    io = f"{p.input_dtype.name} {list(p.obs_shape)}"
    if p.input_quantization is not None:
        io += f" (scale {p.input_quantization[0]:.6g}, zero point {p.input_quantization[1]})"
    q = "int8" if p.q_quantization is not None else "float32"
    fits = ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in summary["fits"].items())
    return f"""\
# {n} on TensorFlow Lite Micro

Generated by `compress-dqn export {e.source} --target micro` (sha256 of the model array
`{hashlib.sha256(e.data).hexdigest()[:16]}...`). Measured with the TFLM Python interpreter:

| | |
|---|---|
| flash (model array) | {len(e.data)} bytes (the TFLM library's code is extra) |
| tensor arena | {e.arena} bytes measured; `{n}::arena_size` = {with_margin(e.arena)} with margin |
| fits RAM budget (arena with margin) | {fits} |
| ops | {', '.join(e.ops)} |
| input | {io} |
| outputs | q_values ({q}, `output({p._q_index})`), action (int32, `output({p._action_index})`) |
| TFLM weight compression | {'applied (needs a TFLM build with compression)' if e.compressed else 'not applied'} |

Files: `{n}_model.h` (constants), `{n}_model.cc` (the array), `{n}_example.cc` (interpreter
setup with a `MicroMutableOpResolver<{len(e.ops)}>` of exactly these ops, and `{n}_act()`),
`{n}.tflite` (the same bytes, for `compress-dqn evaluate {n}.tflite --env ID --runtime micro`).

Add the two .cc files to a TFLM project (github.com/tensorflow/tflite-micro), e.g. next to
`tensorflow/lite/micro/examples/hello_world`, and call `{n}_setup()` once, then `{n}_act(obs)`
each step. The arena was measured on a 64-bit host with the reference kernels: a 32-bit target
needs a little less, optimized kernels (CMSIS-NN) may need scratch space, hence the margin; the
example prints `arena_used_bytes()` so you can check it on the device.
"""


def _checked_int8_io(data: bytes, label: str) -> tuple[bytes, float | None]:
    """The int8-io rewrite, checked to act the same on a grid of inputs; and how far q_values moved
    (None where the policy already had int8 io)."""
    rewritten = int8_io_model(data, label)
    if rewritten == data:
        return data, None
    original, after = MicroPolicy(data), MicroPolicy(rewritten)
    obs = _probe_observations(after, 1000)
    if not np.array_equal(original.actions(obs), after.actions(obs)):
        raise UserError(f"{label}: the int8-io rewrite changed actions (a bug); export with "
                        "quantize: {int8_io: true} instead")
    return rewritten, float(np.abs(original.q_values(obs) - after.q_values(obs)).max())


def _io_figures(policy: MicroPolicy) -> dict[str, Any]:
    """The deployed policy's input and q_values types and quantization parameters."""
    inq, qq = policy.input_quantization, policy.q_quantization
    return {
        "input": {"dtype": policy.input_dtype.name, "shape": list(policy.obs_shape),
                  "scale": inq[0] if inq else None, "zero_point": inq[1] if inq else None},
        "q_values": {"dtype": "int8" if qq else "float32", "scale": qq[0] if qq else None,
                     "zero_point": qq[1] if qq else None},
    }


def export_micro(policy: Path, out_dir: Path | None = None, int8_io: bool = False, name: str | None = None,
                 compress: bool = False) -> dict[str, Any]:
    """Write NAME_model.h/.cc, NAME_example.cc, NAME.tflite and README.md into out_dir; returns the figures.

    int8_io: rewrite a float-io full-integer policy to int8 input and q_values (refused for float
    models). compress: keep TFLM's LUT weight compression when it shrinks the model losslessly
    (it is always tried, and its outcome reported).
    """
    policy = Path(policy)
    data, label = read_tflite(policy)
    _tflm()
    info = inspect_model(data, label)
    _refuse_missing(info, label)
    name = c_name(name) if name else default_name(policy)
    out_dir = Path(out_dir) if out_dir is not None else Path("micro") / name
    q_change = None
    if int8_io:
        data, q_change = _checked_int8_io(data, label)
        info = inspect_model(data, label)
    before = MicroPolicy(data)
    trial = try_compression(data, label)
    uncompressed_bytes = len(data)
    compressed = compress and trial.data is not None
    if compressed:
        data = trial.data
        info = inspect_model(data, label)
    measured = measure_arena(data, label, info)
    deployed = MicroPolicy(data) if compressed else before
    export = _Export(name=name, data=data, ops=info.ops, arena=measured["arena_bytes"], recorded=measured["recorded_bytes"],
                     policy=deployed, source=policy.name if policy.parent == Path(".") else str(policy), compressed=compressed)
    padded = with_margin(export.arena)
    summary: dict[str, Any] = {
        "runs": True, "arena_bytes": export.arena, "arena_bytes_with_margin": padded, "flash_bytes": len(data),
        "ops": info.ops, "reason": None, "fits": {budget: padded <= size for budget, size in RAM_BUDGETS.items()},
    }
    files = {
        f"{name}_model.h": _header(export),
        f"{name}_model.cc": _model_cc(export),
        f"{name}_example.cc": _example_cc(export),
        "README.md": _readme(export, summary),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(out_dir / f"{name}.tflite", data)
    for filename, text in files.items():
        write_text_atomic(out_dir / filename, text)
    return {
        "policy": str(policy), "out": str(out_dir), "name": name, **summary,
        "arena_recorded_bytes": export.recorded, **_io_figures(deployed),
        "int8_io": {"asked": int8_io, "rewritten": q_change is not None, "q_values_max_change": q_change},
        "compression": {"applied": compressed, "flash_bytes_uncompressed": uncompressed_bytes,
                        "flash_bytes_compressed": trial.flash_bytes,
                        "arena_bytes_compressed": trial.arena_bytes, "reason": trial.reason},
        "files": sorted([f"{name}.tflite", *files]),
    }
