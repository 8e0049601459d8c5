"""`export --target c`: a policy as one dependency-free C99 file and its header, no runtime, no allocation.

`int NAME_act(const float *observation)` (`const uint8_t *` for uint8 observations) takes the
observation in the environment's own layout and returns the greedy action, computing what LiteRT's
reference kernels compute (runtime.py says how each rounds), so it plays the same actions. An
int8 policy is integer-only after its input's quantization; a float policy runs in float; a
dynamic-range one runs LiteRT's hybrid kernels (int8 weights, its activations quantized per call,
hybrid.py), in float and integers. Only the ops that lead to `action` are translated: the file
has no other output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.deploy.c import packed
from compress_dqn.deploy.c.runtime import routines
from compress_dqn.deploy.tflite.graph import (
    Op,
    PolicyGraph,
    Tensor,
    conv_geometry,
    double_multiplier,
    hybrid_inexact,
    int8_bounds,
    quantize_multiplier,
    read_policy_graph,
)
from compress_dqn.deploy.base import c_identifier, policy_name
from compress_dqn.errors import UserError

_C_TYPES = {"float32": "float", "int8": "int8_t", "uint8": "uint8_t", "int32": "int32_t"}
_FLOAT_BOUNDS = {"NONE": ("-FLT_MAX", "FLT_MAX"), "RELU": ("0.0f", "FLT_MAX"), "RELU6": ("0.0f", "6.0f"),
                 "RELU_N1_TO_1": ("-1.0f", "1.0f")}
_BINARY = {"SUB": "-", "DIV": "/", "MUL": "*", "ADD": "+"}


@dataclass
class CPolicy:
    """A generated policy: its name, the .c and .h text, and what it holds."""

    name: str
    source: str
    header: str
    obs_type: str
    obs_size: int
    n_actions: int
    integer: bool
    constants_bytes: int
    form: str = "dense"
    """How its int8 weights are stored: dense, sparse, packed (int4) or sparse+packed (packed.py)."""


@dataclass
class _Emitter:
    graph: PolicyGraph
    name: str
    lines: list[str] = field(default_factory=list)
    constants: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)
    buffers: dict[int, str] = field(default_factory=dict)
    locals: list[str] = field(default_factory=list)
    casts: dict[int, tuple[str, str]] = field(default_factory=dict)
    constants_bytes: int = 0
    compress: bool = True
    forms: set[str] = field(default_factory=set)

    def const(self, values: np.ndarray, ctype: str, tag: str) -> str:
        """A static const array of the values; its C name."""
        name = f"{self.name}_{tag}"
        flat = np.asarray(values).ravel()
        text = ", ".join(_c_literals(flat, ctype))
        self.constants.append(f"static const {ctype} {name}[{max(flat.size, 1)}] = {{{text}}};")
        self.constants_bytes += flat.size * np.dtype(_NP[ctype]).itemsize
        return name

    def buffer(self, tensor: Tensor) -> str:
        """The C name holding a computed tensor (a local array, declared on first use)."""
        if tensor.index not in self.buffers:
            name = f"t{tensor.index}"
            self.locals.append(f"  {_C_TYPES[tensor.dtype.name]} {name}[{tensor.size}];")
            self.buffers[tensor.index] = name
        return self.buffers[tensor.index]


_NP = {"float": np.float32, "int8_t": np.int8, "uint8_t": np.uint8, "int32_t": np.int32, "uint64_t": np.uint64,
       "int16_t": np.int16}


def _c_literals(flat: np.ndarray, ctype: str) -> list[str]:
    """Each value as a C literal of ctype, through Python numbers in one conversion (a large layer's
    kernel is a million values: a numpy scalar each took seconds)."""
    if ctype == "float":  # exact: a hex float is the float's own bits
        return [f"{v.hex()}f" for v in flat.astype(np.float32).astype(np.float64).tolist()]
    if ctype == "uint64_t":
        return [f"UINT64_C({v})" for v in flat.astype(np.uint64).tolist()]
    return [str(v) for v in flat.astype(np.int64).tolist()]


def _c_literal(value: Any, ctype: str) -> str:
    """One value as a C literal of ctype."""
    return _c_literals(np.asarray([value]), ctype)[0]


def generate_c(source: Any, name: str, compress: bool = True) -> CPolicy:
    """Translate a .tflite policy (path or bytes) into C; compress=False stores every weight dense, a byte each
    (the form to compare a compressed one against: packed.py)."""
    graph = read_policy_graph(source)
    name = c_identifier(name)
    e = _Emitter(graph, name, compress=compress)
    obs = graph.observation
    obs_type = "uint8_t" if obs.dtype == np.uint8 and not obs.quantized else "float"
    _prologue(e, obs_type)
    result = None
    for op in e.graph.ops:
        if op.kind == "ARG_MAX":
            result = _argmax(e, op)
            continue
        _EMIT[op.kind](e, op)
    if result is None:
        raise UserError(f"{graph.label}: no ARG_MAX computes its action; export it with compress-dqn")
    body = "\n".join([*e.locals, *e.lines, f"  return {result};"])
    n = obs.size
    guard = f"{name.upper()}_H"
    header = "\n".join([
        f"/* {name}: a DQN policy, generated by compress-dqn export --target c. */",
        f"#ifndef {guard}", f"#define {guard}", "", "#include <stdint.h>", "",
        f"#define {name.upper()}_OBS_SIZE {n}  /* observation values, shape {list(graph.obs_shape)} */",
        f"#define {name.upper()}_N_ACTIONS {graph.n_actions}", "",
        f"/* The greedy action for one observation ({n} values in the environment's own layout). */",
        f"int {name}_act(const {obs_type} *observation);", "", f"#endif  /* {guard} */", ""])
    text = "\n".join([
        f"/* {name}: generated by compress-dqn export --target c from {Path(graph.label).name}.",
        " * C99, no allocation, no runtime; computes what LiteRT's reference kernels compute.",
        " * Compile float arithmetic without fused multiply-add contraction (-ffp-contract=off). */",
        "#if defined(__clang__)", "#pragma STDC FP_CONTRACT OFF", "#endif", f'#include "{name}.h"', "#include <float.h>", "#include <stdint.h>", "",
        routines(e.used), *e.constants, "", f"int {name}_act(const {obs_type} *observation) {{", body, "}", ""])
    return CPolicy(name, text, header, obs_type, n, graph.n_actions, graph.integer, e.constants_bytes,
                   packed.form_name(e.forms))


def _prologue(e: _Emitter, obs_type: str) -> None:
    """Bind the observation; an int8-input policy normalizes and quantizes it here, as its caller must."""
    obs = e.graph.observation
    if not obs.quantized:
        e.buffers[obs.index] = "observation"
        return
    q = e.buffer(obs)
    scale, zero = float(obs.scales[0]), int(obs.zero_points[0])
    lines = []
    if e.graph.caller_normalization is not None:
        mean, std = e.graph.caller_normalization.mean, e.graph.caller_normalization.std
        m, s = e.const(mean, "float", "mean"), e.const(std, "float", "std")
        lines.append(f"    float v = observation[i] - {m}[i];\n    v = v / {s}[i];")
    else:
        lines.append("    float v = observation[i];")
    e.used.update({"round_even", "clamp8"})
    # As compress-dqn's loader quantizes: np.round(x / scale + zero_point) in float32, ties to even.
    lines.append(f"    v = v / {_c_literal(scale, 'float')};\n    v = v + {_c_literal(zero, 'float')};\n"
                 f"    {q}[i] = clamp8(round_even(v), -128, 127);")
    e.lines.append(f"  for (int i = 0; i < {obs.size}; ++i) {{\n" + "\n".join(lines) + "\n  }")


def _elementwise(e: _Emitter, op: Op) -> None:
    """SUB, DIV, MUL or ADD in float, a constant broadcast over the last axis (the graph's normalization)."""
    a, b = op.inputs[:2]
    out = op.outputs[0]
    if out.dtype != np.float32:
        raise UserError(f"{e.graph.label}: an {out.dtype.name} {op.kind} on the action's path; the C export "
                        "translates float ones only")
    y = e.buffer(out)
    operands = [_operand(e, t, out, f"{op.kind.lower()}{out.index}_{k}") for k, t in enumerate((a, b))]
    lo, hi = _FLOAT_BOUNDS[op.activation]
    e.lines.append(f"  for (int i = 0; i < {out.size}; ++i) {{\n"
                   f"    float v = {operands[0]} {_BINARY[op.kind]} {operands[1]};\n"
                   f"    {y}[i] = v < {lo} ? {lo} : (v > {hi} ? {hi} : v);\n  }}"
                   if op.activation != "NONE" else
                   f"  for (int i = 0; i < {out.size}; ++i) {y}[i] = {operands[0]} {_BINARY[op.kind]} {operands[1]};")


def _operand(e: _Emitter, t: Tensor, out: Tensor, tag: str) -> str:
    if t.value is None:
        if t.size not in (1, out.size):
            raise UserError(f"{e.graph.label}: a broadcast of a computed tensor; the C export broadcasts one value only")
        return f"{e.buffers[t.index]}[{'i' if t.size == out.size else 0}]"
    values = t.real().ravel()
    if values.size == 1:
        return _c_literal(values[0], "float")
    last = out.shape[-1] if out.shape else 1
    if values.size not in (out.size, last):
        raise UserError(f"{e.graph.label}: a constant of {values.size} values against {out.size}; not translated")
    name = e.const(values, "float", tag)
    return f"{name}[i]" if values.size == out.size else f"{name}[i % {last}]"


def _cast(e: _Emitter, op: Op) -> None:
    x, out = op.inputs[0], op.outputs[0]
    if out.dtype != np.float32:
        raise UserError(f"{e.graph.label}: a CAST to {out.dtype.name}; the C export casts to float only")
    line = f"  for (int i = 0; i < {out.size}; ++i) {e.buffer(out)}[i] = (float){e.buffers[x.index]}[i];"
    e.lines.append(line)
    e.casts[out.index] = (line, e.locals[-1] if e.locals[-1].startswith(f"  float {e.buffers[out.index]}[") else "")


def _quantize(e: _Emitter, op: Op) -> None:
    x, out = op.inputs[0], op.outputs[0]
    if x.dtype != np.float32 or out.dtype != np.int8:
        raise UserError(f"{e.graph.label}: a {x.dtype.name} -> {out.dtype.name} QUANTIZE; translated: float -> int8")
    if _is_input_cast(e, x):  # uint8 observation -> float -> int8: a 256-entry table, no float at all
        table = _quantize_table(x, out)
        name = e.const(table, "int8_t", f"lut{out.index}")
        src = e.buffers[e.graph.observation.index]
        e.lines.append(f"  for (int i = 0; i < {out.size}; ++i) {e.buffer(out)}[i] = {name}[{src}[i]];")
        return
    e.used.update({"round_away", "clamp8"})
    scale, zero = _c_literal(out.scales[0], "float"), int(out.zero_points[0])
    e.lines.append(f"  for (int i = 0; i < {out.size}; ++i) {{\n    float v = {e.buffers[x.index]}[i] / {scale};\n"
                   f"    {e.buffer(out)}[i] = clamp8(round_away(v) + {zero}, -128, 127);\n  }}")


def _is_input_cast(e: _Emitter, x: Tensor) -> bool:
    """Whether x is the uint8 observation cast to float (so its 256 values can be tabulated)."""
    obs = e.graph.observation
    producer = next((op for op in e.graph.ops if op.outputs[0] is x), None)
    if producer is None or producer.kind != "CAST" or producer.inputs[0] is not obs or obs.dtype != np.uint8:
        return False
    line, local = e.casts[x.index]  # the table replaces the CAST's loop and its float buffer
    e.lines.remove(line)
    if local:
        e.locals.remove(local)
    return True


def _quantize_table(x: Tensor, out: Tensor) -> np.ndarray:
    v = np.arange(256, dtype=np.float32) / np.float32(out.scales[0])
    rounded = np.sign(v.astype(np.float64)) * np.floor(np.abs(v.astype(np.float64)) + 0.5)
    return np.clip(rounded + int(out.zero_points[0]), -128, 127).astype(np.int8)


def _reshape(e: _Emitter, op: Op) -> None:
    e.buffers[op.outputs[0].index] = e.buffers[op.inputs[0].index]  # same bytes, another shape


def _dequantize(e: _Emitter, op: Op) -> None:
    x, out = op.inputs[0], op.outputs[0]
    scale, zero = _c_literal(x.scales[0], "float"), int(x.zero_points[0])
    e.lines.append(f"  for (int i = 0; i < {out.size}; ++i) {e.buffer(out)}[i] = "
                   f"(float)((int32_t){e.buffers[x.index]}[i] - {zero}) * {scale};")


def _fc(e: _Emitter, op: Op) -> None:
    x, w, bias = op.inputs[:3]
    out = op.outputs[0]
    n_out, n_in = w.shape
    if op.hybrid:
        _fc_hybrid(e, op)
        return
    if x.dtype == np.float32:
        weights = w.real() if w.value is not None else None
        if weights is None:
            raise UserError(f"{e.graph.label}: a FULLY_CONNECTED with computed weights; not translated")
        e.used.add("fc_f32")
        wn = e.const(weights, "float", f"w{out.index}")
        bn = e.const(bias.real(), "float", f"b{out.index}") if bias is not None else "0"
        lo, hi = _FLOAT_BOUNDS[op.activation]
        e.lines.append(f"  fc_f32({e.buffers[x.index]}, {n_in}, {wn}, {bn}, {n_out}, {lo}, {hi}, {e.buffer(out)});")
        return
    if x.dtype != np.int8 or w.dtype != np.int8 or np.any(w.zero_points != 0):
        raise UserError(f"{e.graph.label}: a {x.dtype.name} x {w.dtype.name} FULLY_CONNECTED; translated: "
                        "float, and int8 with symmetric int8 weights")
    m, s = zip(*(double_multiplier(x.scales[0], fs, out.scales[0]) for fs in w.scales))
    form, wn = packed.weights(e, w, packed.as_rows(op), f"w{out.index}")
    e.used.add(f"fc_s8{form}")
    bn = "0, 0"
    if bias is not None:
        narrow = bool(np.all(np.abs(bias.value.astype(np.int64)) < 1 << 15))
        name = e.const(bias.value, "int16_t" if narrow else "int32_t", f"b{out.index}")
        bn = f"0, {name}" if narrow else f"{name}, 0"
    mn, sn = e.const(np.array(m, np.uint64), "uint64_t", f"m{out.index}"), e.const(np.array(s), "uint8_t", f"s{out.index}")
    lo, hi = int8_bounds(out, op.activation)
    e.lines.append(f"  fc_s8{form}({e.buffers[x.index]}, {n_in}, {int(x.zero_points[0])}, {wn}, {bn}, {n_out}, {mn}, {sn}, "
                   f"{int(w.scales.size > 1)}, {int(out.zero_points[0])}, {lo}, {hi}, {e.buffer(out)});")


def _hybrid_weights(e: _Emitter, op: Op) -> tuple[str, str, str, str]:
    """A dynamic-range op's int8 weights (their form's kernel suffix, packed.py), their scales and its float
    bias, as C constants."""
    w, bias, out = op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else None, op.outputs[0]
    reason = hybrid_inexact(op)
    if reason:  # the C export has no float kernel to widen it into: refused, naming the shared rule's reason
        raise UserError(f"{e.graph.label}: a {op.kind} with {reason}; the C export does not repeat it exactly "
                        "(export the policy without prune.sparse_format, or as int8)")
    # A hybrid conv keeps its weights dense: compress-dqn writes none that covers its whole input.
    rows = packed.as_rows(op) if op.kind == "FULLY_CONNECTED" else None
    form, weights = packed.weights(e, w, rows, f"w{out.index}")
    scales = e.const(w.scales, "float", f"ws{out.index}")
    return form, weights, scales, e.const(bias.real(), "float", f"b{out.index}") if bias is not None else "0"


def _hybrid_scratch(e: _Emitter, op: Op) -> str:
    """The int8 buffer a hybrid op quantizes its input into, on every call."""
    name = f"q{op.outputs[0].index}"
    e.locals.append(f"  int8_t {name}[{op.inputs[0].size}];")
    return name


def _fc_hybrid(e: _Emitter, op: Op) -> None:
    """A dynamic-range FULLY_CONNECTED: LiteRT's hybrid kernel, its input quantized per call (hybrid.py);
    asymmetric where the op's asymmetric_quantize_inputs is set."""
    x, w, out = op.inputs[0], op.inputs[1], op.outputs[0]
    n_out, n_in = w.shape
    form, weights, scales, bias = _hybrid_weights(e, op)
    e.used.add(f"fc_hybrid{form}")
    asymmetric = int(bool(op.options.get("asymmetricQuantizeInputs", False)))
    lo, hi = _FLOAT_BOUNDS[op.activation]
    e.lines.append(f"  fc_hybrid{form}({e.buffers[x.index]}, {n_in}, {weights}, {bias}, {n_out}, {scales}, "
                   f"{int(w.scales.size > 1)}, {asymmetric}, {lo}, {hi}, {_hybrid_scratch(e, op)}, {e.buffer(out)});")


def _conv(e: _Emitter, op: Op) -> None:
    x, w, bias = op.inputs[:3]
    out = op.outputs[0]
    _, ih, iw, ic = x.shape
    oc, kh, kw, fic = w.shape
    _, oh, ow, _ = out.shape
    if fic != ic:
        raise UserError(f"{e.graph.label}: a grouped CONV_2D; not translated")
    (sh, sw), (dh, dw), (ph, pw, _, _) = conv_geometry(op)
    geometry = f"{oc}, {kh}, {kw}, {sh}, {sw}, {dh}, {dw}, {ph}, {pw}, {oh}, {ow}"
    if op.hybrid:
        # LiteRT runs the per-channel kernel (asymmetric input) unless every channel has the same scale.
        _, weights, scales, bn = _hybrid_weights(e, op)
        per_channel = int(bool(np.any(w.scales != w.scales[0])))
        e.used.add("conv_hybrid")
        lo, hi = _FLOAT_BOUNDS[op.activation]
        e.lines.append(f"  conv_hybrid({e.buffers[x.index]}, {ih}, {iw}, {ic}, {weights}, {bn}, {geometry}, {scales}, "
                       f"{per_channel}, {lo}, {hi}, {_hybrid_scratch(e, op)}, {e.buffer(out)});")
        return
    if x.dtype == np.float32:
        e.used.add("conv_f32")
        wn, lo_hi = e.const(w.real(), "float", f"w{out.index}"), _FLOAT_BOUNDS[op.activation]
        bn = e.const(bias.real(), "float", f"b{out.index}") if bias is not None else "0"
        e.lines.append(f"  conv_f32({e.buffers[x.index]}, {ih}, {iw}, {ic}, {wn}, {bn}, {geometry}, "
                       f"{lo_hi[0]}, {lo_hi[1]}, {e.buffer(out)});")
        return
    multipliers = [quantize_multiplier(float(np.float32(x.scales[0])) * float(fs) / float(np.float32(out.scales[0])))
                   for fs in np.broadcast_to(w.scales, (oc,))]
    mult, shift = zip(*multipliers)
    form, wn = packed.weights(e, w, packed.as_rows(op), f"w{out.index}")
    e.used.add(f"conv1_s8{form}" if form else "conv_s8")
    bn = e.const(bias.value, "int32_t", f"b{out.index}") if bias is not None else "0"
    mn, sn = e.const(np.array(mult), "int32_t", f"m{out.index}"), e.const(np.array(shift), "int8_t", f"s{out.index}")
    lo, hi = int8_bounds(out, op.activation)
    if form:  # one output pixel over the whole input: an FC's row sums (packed.as_rows)
        e.lines.append(f"  conv1_s8{form}({e.buffers[x.index]}, {ih * iw * ic}, {int(x.zero_points[0])}, {wn}, {bn}, {oc}, "
                       f"{mn}, {sn}, {int(out.zero_points[0])}, {lo}, {hi}, {e.buffer(out)});")
        return
    e.lines.append(f"  conv_s8({e.buffers[x.index]}, {ih}, {iw}, {ic}, {int(x.zero_points[0])}, {wn}, {bn}, {geometry}, "
                   f"{mn}, {sn}, {int(out.zero_points[0])}, {lo}, {hi}, {e.buffer(out)});")


def _argmax(e: _Emitter, op: Op) -> str:
    x = op.inputs[0]
    if op.outputs[0] is not e.graph.action:
        raise UserError(f"{e.graph.label}: an ARG_MAX besides the action's; not translated")
    kind = {"int8": "argmax_s8", "float32": "argmax_f32"}.get(x.dtype.name)
    if kind is None:
        raise UserError(f"{e.graph.label}: an ARG_MAX over {x.dtype.name}; translated: int8, float")
    e.used.add(kind)
    return f"{kind}({e.buffers[x.index]}, {x.shape[-1]})"


_EMIT = {"SUB": _elementwise, "DIV": _elementwise, "MUL": _elementwise, "ADD": _elementwise, "CAST": _cast,
         "QUANTIZE": _quantize, "DEQUANTIZE": _dequantize, "RESHAPE": _reshape, "FULLY_CONNECTED": _fc,
         "CONV_2D": _conv}


def default_name(policy: Path) -> str:
    """The policy's name (policy_name) as a C identifier."""
    return c_identifier(policy_name(policy))
