"""A Keras 3 model file as data: which files are Keras 3's, their config as JSON and their weights through h5py.

Keras 3 (`tf.keras` in every TensorFlow since 2.16) writes two formats tf_keras cannot load: the
.keras zip (config.json, metadata.json, model.weights.h5) and the legacy .h5 (the config in the
`model_config` attribute, the weights under `model_weights/`). Nothing here deserializes an object:
the config is parsed with `json.loads` and the weights are arrays read by h5py, so the allow-list
check (keras3_graph) runs before any Keras loader sees the file. `model.export()` SavedModels are
told apart so they can be refused with the way to save a loadable file.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError

MAX_CONFIG_BYTES = 16 << 20  # a Q-network's config is kilobytes; a larger one is not a model config
MAX_WEIGHTS_BYTES = 4 << 30
EXPORT_HINT = "save the Keras model itself with model.save('q.keras') (or 'q.h5') and pass that file"


def _major(version: Any) -> str:
    text = version.decode() if isinstance(version, bytes) else str(version)
    return text.split(".", 1)[0]


def _zip_version(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            if "metadata.json" not in archive.namelist():
                return None
            info = archive.getinfo("metadata.json")
            if info.file_size > MAX_CONFIG_BYTES:
                return None
            meta = json.loads(archive.read(info))
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    return meta.get("keras_version") if isinstance(meta, dict) else None


def _h5_version(path: Path) -> str | None:
    import h5py

    try:
        with h5py.File(path, "r") as handle:
            return handle.attrs.get("keras_version")
    except (OSError, ValueError):
        return None


def is_keras3(path: Path) -> bool:
    """Whether a .keras zip or HDF5 file was saved by Keras 3, or a directory is Keras 3's model.export()."""
    if path.is_dir():
        return is_keras3_export(path)
    with open(path, "rb") as handle:
        head = handle.read(8)
    version = _h5_version(path) if head.startswith(b"\x89HDF") else _zip_version(path)
    return version is not None and _major(version) == "3"


def is_keras3_export(path: Path) -> bool:
    """A SavedModel written by Keras 3's model.export(): no Keras metadata (tf_keras's own SavedModels
    carry keras_metadata.pb), and the variables Keras 3's ExportArchive tracks as `_all_variables`."""
    graph = path / "saved_model.pb"
    if not graph.is_file() or (path / "keras_metadata.pb").exists() or graph.stat().st_size > 256 << 20:
        return False
    return b"_all_variables/0/.ATTRIBUTES" in graph.read_bytes()


def _json(text: Any, label: str, where: str) -> dict:
    if isinstance(text, bytes) and len(text) > MAX_CONFIG_BYTES:
        raise UserError(f"{label}: its {where} is over {MAX_CONFIG_BYTES >> 20} MB; not a Q-network's config")
    try:
        config = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{label}: its {where} is not JSON ({str(exc)[:80]}); save the model again") from None
    if not isinstance(config, dict):
        raise UserError(f"{label}: its {where} is not a model config; save the model again")
    return config


class Keras3File:
    """A Keras 3 .keras or .h5 file: its config (as data) and, once that is checked, its weights by layer."""

    def __init__(self, path: Path) -> None:
        self.path, self.label = path, f"baseline.from: {path}"
        if path.is_dir():
            raise UserError(f"{self.label}: a SavedModel written by Keras 3's model.export(), which keeps the "
                            f"computation but not the layers to compress; {EXPORT_HINT}")
        with open(path, "rb") as handle:
            self.h5 = handle.read(8).startswith(b"\x89HDF")
        self.format = "a Keras 3 .h5 file" if self.h5 else "a Keras 3 .keras file"
        self.config = self._read_config()

    def _read_config(self) -> dict:
        if self.h5:
            import h5py

            with h5py.File(self.path, "r") as handle:
                text = handle.attrs.get("model_config")
            if text is None:
                raise UserError(f"{self.label}: an .h5 file with weights only (no model_config); save the whole "
                                "model with model.save('q.keras')")
            return _json(text.encode() if isinstance(text, str) else text, self.label, "model_config")
        with zipfile.ZipFile(self.path) as archive:
            names = archive.namelist()
            if "config.json" not in names:
                raise UserError(f"{self.label}: a .keras zip without config.json; save it again with model.save('q.keras')")
            info = archive.getinfo("config.json")
            if info.file_size > MAX_CONFIG_BYTES:
                raise UserError(f"{self.label}: its config.json is over {MAX_CONFIG_BYTES >> 20} MB; not a Q-network's config")
            return _json(archive.read(info), self.label, "config.json")

    def weights(self, layers: list[dict]) -> dict[str, list[np.ndarray]]:
        """Each layer's variables in Keras's order (kernel, bias; gamma, beta, mean, variance), by layer name.

        `layers`: the model's layer configs in model order, as the .keras weights file names them."""
        if self.h5:
            return self._h5_weights()
        with zipfile.ZipFile(self.path) as archive:
            if "model.weights.h5" not in archive.namelist():
                raise UserError(f"{self.label}: a .keras zip without model.weights.h5 (sharded or damaged); save it "
                                "again with model.save('q.keras')")
            info = archive.getinfo("model.weights.h5")
            if info.file_size > MAX_WEIGHTS_BYTES:
                raise UserError(f"{self.label}: its weights are over {MAX_WEIGHTS_BYTES >> 30} GB; not a Q-network")
            blob = archive.read(info)
        return self._zip_weights(io.BytesIO(blob), layers)

    def _zip_weights(self, blob: io.BytesIO, layers: list[dict]) -> dict[str, list[np.ndarray]]:
        """model.weights.h5 keys layers by class (`layers/dense_1/vars/0`), counted in model order, not by name."""
        import h5py

        out: dict[str, list[np.ndarray]] = {}
        used: dict[str, int] = {}
        with h5py.File(blob, "r") as handle:
            for layer in layers:
                key = _snake(str(layer.get("class_name", "")))
                used[key] = used.get(key, -1) + 1
                key = f"{key}_{used[key]}" if used[key] else key
                group = handle.get(f"layers/{key}/vars")
                if isinstance(group, h5py.Group):
                    out[layer_name(layer)] = [np.asarray(group[str(i)]) for i in range(len(group))
                                              if isinstance(group.get(str(i)), h5py.Dataset)]
        return out

    def _h5_weights(self) -> dict[str, list[np.ndarray]]:
        import h5py

        out: dict[str, list[np.ndarray]] = {}
        with h5py.File(self.path, "r") as handle:
            group = handle.get("model_weights")
            if not isinstance(group, h5py.Group):
                raise UserError(f"{self.label}: an .h5 file without model_weights; save it again with model.save()")
            for name in group.attrs.get("layer_names", []):
                name = name.decode() if isinstance(name, bytes) else str(name)
                layer = group.get(name)
                names = layer.attrs.get("weight_names", []) if isinstance(layer, h5py.Group) else []
                arrays = [layer.get(n.decode() if isinstance(n, bytes) else str(n)) for n in names]
                if any(not isinstance(a, h5py.Dataset) for a in arrays):
                    raise UserError(f"{self.label}: layer {name}'s weights are missing from the file; save it again")
                out[name] = [np.asarray(a) for a in arrays]
        return out


def layer_name(layer: dict) -> str:
    """A layer config's name (Keras 3 puts it beside the config and inside it)."""
    config = layer.get("config") if isinstance(layer.get("config"), dict) else {}
    return str(layer.get("name") or config.get("name") or "?")


def _snake(name: str) -> str:
    """Keras 3's naming.to_snake_case: the key its weights file gives a layer of this class."""
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()
