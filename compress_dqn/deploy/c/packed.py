"""Compressed int8 weights in the C export: sparse rows and int4 kernels two a byte, walked where they lie in flash.

A pruned layer stored dense spends a byte of flash on every zero, a 4-bit kernel a byte on every
4-bit weight. Per layer, where it saves flash (`choose`), the C export stores the weight matrix
(an int8 or dynamic-range FULLY_CONNECTED's, or an int8 CONV_2D's that covers its whole input: one
output pixel, an FC over the flattened input, `as_rows`) in one of two forms, and the kernels here read it in place, nothing
decompressed into RAM:
- sparse: per output row its nonzero weights in column order, with a count a row (a byte each, or
  two little-endian bytes where a row holds over 255) and a column step a weight (a byte; the first
  from column 0). A step over 255 goes through fill entries of weight 0. Every stream is read a byte
  at a time: no wide or unaligned load (the Cortex-M0+ faults on unaligned ones).
- int4 (the file's INT4 kernels): two weights a byte, the first in the low nibble (TFLite's own
  layout), rows back to back; each weight unpacked in the loop and sign-extended.

Why the actions and Q-values stay bit for bit those of the dense C and of LiteRT's reference kernels:
int8 weights are symmetric (zero point 0; the FC refuses others, conv and INT4 weights are symmetric
by TFLite's spec), so a zero weight adds w * (x - x_zero) = 0 to the int32 sum, and so does a fill
entry; the sum of the remaining products is the same integer in any order (no int32 overflow:
|w| <= 127, |x - x_zero| <= 255, and a row has far fewer than 2^31 / 2^15 inputs). Bias,
requantization (fc_scale, mbqm), clamping and the hybrid kernels' float scaling read that integer
exactly as the dense kernels do. The hybrid FC's `dot - row_sum * zero_point` is computed as the sum
of w * (q - zero_point): the same integer (zeros add nothing to the dot or to the row sum). An int4
weight unpacked is the value LiteRT unpacks. Float weights are not compressed here (a float sum's
order and signed zeros are part of its result).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from compress_dqn.deploy.tflite.graph import Op, Tensor, conv_geometry

MARGIN = 512
"""The least flash a compressed form must save over the dense bytes, above its kernel's code (the demo's sparse
FC added 28 B of code on a Cortex-M4F, 156 B on a Cortex-M0+), so that a small or dense layer keeps its C byte for byte."""

SPARSE, INT4 = "_sparse", "_int4"
FORMS = {"": "dense", SPARSE: "sparse", INT4: "packed"}


def as_rows(op: Op) -> np.ndarray | None:
    """The op's constant int8 weights as an (outputs, inputs) matrix whose row o is read against the input in
    its own order; None where the C keeps them dense (a convolution with more than one output pixel or padding)."""
    w = op.inputs[1]
    if w.value is None or w.dtype != np.int8 or (w.zero_points is not None and np.any(w.zero_points != 0)):
        return None  # only symmetric weights: a zero weight must add nothing
    if op.kind == "FULLY_CONNECTED":
        return w.value.reshape(w.shape[0], -1)
    _, ih, iw, ic = op.inputs[0].shape
    oc, kh, kw, _ = w.shape
    (_, _), (dh, dw), pads = conv_geometry(op)
    # One output pixel, the kernel over the whole input, no padding: filter (fy, fx, c) meets input (fy, fx, c),
    # so the flattened filter and the flattened input line up, as in an FC.
    if op.outputs[0].shape[1:3] != (1, 1) or (kh, kw) != (ih, iw) or any(pads) or (dh, dw) != (1, 1):
        return None
    return w.value.reshape(oc, -1)


def sparse_streams(rows: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """(counts, wide, steps, weights) of a matrix in the sparse form: counts a byte a row (wide 0) or two
    little-endian bytes (wide 1), a column step and a weight an entry, fill entries of weight 0 for steps over 255."""
    counts, steps, weights = [], [], []
    for row in rows:
        column, n = 0, 0
        for j in np.flatnonzero(row):
            step = int(j) - column
            while step > 255:  # a fill entry: weight 0 adds nothing to the sum
                steps.append(255)
                weights.append(0)
                step -= 255
                n += 1
            steps.append(step)
            weights.append(int(row[j]))
            column, n = int(j), n + 1
        counts.append(n)
    wide = int(max(counts, default=0) > 255)
    count_bytes = (np.array(counts, "<u2").view(np.uint8) if wide else np.array(counts, np.uint8))
    return count_bytes, wide, np.array(steps, np.uint8), np.array(weights, np.int8)


def pack_int4(rows: np.ndarray) -> np.ndarray:
    """The matrix's values (each in [-8, 7]) two a byte, the first of a pair in the low nibble, rows back to back."""
    nibbles = (rows.ravel().astype(np.int16) & 0x0F).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)


def sparse_bytes(rows: np.ndarray) -> int:
    """The sparse form's flash: its counts, steps and weights."""
    counts, _, steps, weights = sparse_streams(rows)
    return counts.size + steps.size + weights.size


def choose(w: Tensor, rows: np.ndarray | None) -> str:
    """The form that takes least flash (SPARSE, INT4, or "" for dense), dense unless another saves MARGIN bytes."""
    if rows is None:
        return ""
    dense = rows.size
    sizes = {"": dense}
    if w.int4 and rows.min(initial=0) >= -8 and rows.max(initial=0) <= 7:
        sizes[INT4] = (rows.size + 1) // 2
    if np.count_nonzero(rows) * 2 + MARGIN < dense:  # at most half dense: worth building the streams
        sizes[SPARSE] = sparse_bytes(rows)
    best = min(sizes, key=lambda k: (sizes[k], k != ""))
    return best if sizes[best] + MARGIN <= dense else ""


def weights(e: Any, w: Tensor, rows: np.ndarray | None, tag: str) -> tuple[str, str]:
    """Emit a layer's int8 weights as C constants: (the kernel suffix, the kernel's weight arguments). Dense
    (suffix "") emits exactly the one array the dense kernels take, so an uncompressed policy's C is unchanged."""
    form = choose(w, rows) if e.compress else ""
    if form == SPARSE:
        counts, wide, steps, values = sparse_streams(rows)
        names = (e.const(counts, "uint8_t", f"{tag}n"), e.const(steps, "uint8_t", f"{tag}d"), e.const(values, "int8_t", tag))
        e.forms.add(SPARSE)
        return SPARSE, f"{names[0]}, {wide}, {names[1]}, {names[2]}"
    if form == INT4:
        e.forms.add(INT4)
        return INT4, e.const(pack_int4(rows), "uint8_t", f"{tag}p")
    return "", e.const(w.value, "int8_t", tag)


def form_name(forms: set[str]) -> str:
    """The policy's weight storage in words: dense, sparse, packed, or sparse+packed."""
    named = [FORMS[f] for f in (SPARSE, INT4) if f in forms]
    return "+".join(named) or "dense"
