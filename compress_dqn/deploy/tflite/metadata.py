"""Edits of a TFLite flatbuffer without TensorFlow: named metadata entries, and short tensor names.

Each edit changes a decoded `TFLiteFile` in place (the export chaining them packs once); its
bytes-in, bytes-out forms (add_metadata, with_input_normalization, ...) decode, edit and pack once each.

A policy with a float input carries its input normalization as graph ops (graph_input.py). One
with an integer input (int8 I/O) cannot: its caller normalizes and quantizes, and the metadata
entry `INPUT_NORMALIZATION` (JSON: {"mean": [...], "std": [...]}) says with what, as the C++
header of a micro export does.
"""

from __future__ import annotations

import json

import numpy as np

from compress_dqn.deploy.tflite.file import TFLiteFile, edit_bytes
from compress_dqn.deploy.tflite.reader import pack as pack_model  # noqa: F401 (tests pack a ModelT through it)
from compress_dqn.deploy.tflite.reader import read_metadata
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError

INPUT_NORMALIZATION = "compress_dqn.input_normalization"


def short_tensor_names(model: TFLiteFile) -> None:
    """Each inner tensor named by its index ("t7") in place; graph inputs and outputs keep theirs.

    The converter names tensors after the fused TF ops they came from ("student_split/quant_hidden_0/
    MatMul;student_split/quant_hidden_0/LastValueQuant/FakeQuantWithMinMaxVars"): 1.6 KB of a 6.4 KB
    CartPole student, and flash on a microcontroller. No runtime reads them: the serving signature
    maps its names to tensor indices.
    """
    for graph in model.model.subgraphs or []:
        keep = set(graph.inputs.tolist() if graph.inputs is not None else []) | set(
            graph.outputs.tolist() if graph.outputs is not None else [])
        for i, tensor in enumerate(graph.tensors or []):
            if i not in keep:
                tensor.name = f"t{i}"
    model.edited = True  # packed even where every name was short already, as exports always were



def set_metadata(model: TFLiteFile, name: str, payload: bytes) -> None:
    """Metadata entry `name` set to payload in place (replacing an entry of that name)."""
    schema, fb = model.schema, model.model
    fb.metadata = [m for m in (fb.metadata or []) if (m.name.decode() if isinstance(m.name, bytes) else m.name) != name]
    entry = schema.MetadataT()
    entry.name = name
    entry.buffer = model.add_buffer(payload)
    fb.metadata.append(entry)
    model.edited = True


def add_metadata(data: bytes, name: str, payload: bytes) -> bytes:
    """The file's bytes with metadata entry `name` set to payload (replacing an entry of that name)."""
    return edit_bytes(data, set_metadata, name, payload)


def drop_metadata(model: TFLiteFile, name: str) -> None:
    """Metadata entry `name` removed in place (its buffer left empty), where the model has one."""
    kept = []
    for entry in model.model.metadata or []:
        if (entry.name.decode() if isinstance(entry.name, bytes) else entry.name) == name:
            model.model.buffers[entry.buffer].data = None
            model.edited = True
        else:
            kept.append(entry)
    if model.edited:
        model.model.metadata = kept



def input_normalization(data: bytes, label: str = "<bytes>", features: int | None = None) -> Normalization | None:
    """The normalization per input feature, if the model expects normalized observations; checked to be
    finite, with std > 0 and (given `features`, the model's input size) one pair per feature, so
    every loader refuses what would otherwise play quietly on wrongly scaled inputs."""
    if INPUT_NORMALIZATION.encode() not in data:  # the entry's name is stored verbatim: no need to parse
        return None
    try:
        raw = read_metadata(data, INPUT_NORMALIZATION)
    except Exception:  # a damaged flatbuffer raises whatever its parser hits (struct, index, unicode)
        raise UserError(f"{label}: its metadata is unreadable; is the file truncated? Re-export the policy") from None
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
        mean, std = np.asarray(spec["mean"], np.float32), np.asarray(spec["std"], np.float32)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        mean = std = None
    if (mean is None or mean.ndim != 1 or mean.shape != std.shape or not np.all(std > 0)
            or not np.all(np.isfinite(mean)) or not np.all(np.isfinite(std))):
        raise UserError(f"{label}: its input normalization metadata is unreadable; re-export the policy")
    if features is not None and mean.size != features:
        raise UserError(f"{label}: its input normalization has {mean.size} features but its input has {features}; "
                        "re-export the policy")
    return Normalization(mean, std)


def caller_normalization(data: bytes, label: str, features: int, integer_input: bool) -> Normalization | None:
    """The normalization a caller applies before quantizing the model's integer input (int8 I/O), or None.

    A float-input model carries its normalization in its graph (graph_input.py); one that still has
    the entry was written before that, and only a loader reading it would play it right: refused,
    with the command that rewrites it self-contained.
    """
    found = input_normalization(data, label, features)
    if found is not None and not integer_input:
        raise UserError(f"{label}: an older export that needs its loader to normalize the observation (metadata "
                        f"{INPUT_NORMALIZATION}); make it self-contained: compress-dqn export {label} --target tflite")
    return found


def mark_input_normalization(model: TFLiteFile, normalization: Normalization) -> None:
    """The model marked in place as taking (obs - mean) / std, for a caller that quantizes its integer input."""
    spec = {"mean": _shortest(normalization.mean), "std": _shortest(normalization.std)}
    set_metadata(model, INPUT_NORMALIZATION, json.dumps(spec, separators=(",", ":")).encode())


def with_input_normalization(data: bytes, normalization: Normalization) -> bytes:
    """The file's bytes with `mark_input_normalization` applied."""
    return edit_bytes(data, mark_input_normalization, normalization)


def _shortest(values: np.ndarray) -> list[float]:
    """float32 values as the shortest decimals that read back to the same float32 (a tiny policy's
    file should not spend ~17 digits per number on float64 noise)."""
    return [float(np.format_float_positional(x, unique=True, trim="-")) if abs(x) >= 1e-4 or x == 0
            else float(np.format_float_scientific(x, unique=True)) for x in np.ravel(values).astype(np.float32)]
