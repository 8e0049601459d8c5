"""A Keras Q-network file (.keras, .h5 or a Keras SavedModel directory), loaded in safe mode and checked.

Safe mode is forced on for every format: tf_keras honours `safe_mode` only for zip .keras files,
and an .h5 file (or HDF5 bytes named .keras) with a Lambda layer would otherwise run the Python
code stored in it while loading.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from compress_dqn._tf import quiet_stderr, tf_keras
from compress_dqn.errors import UserError


def _shape(value: Any) -> tuple:
    return tuple(None if d is None else int(d) for d in value)


def load_keras(path: Path, info: Any) -> Any:
    """The tf_keras model in `path`, its one input and output checked against the environment."""
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    if path.is_file() and path.suffix not in (".keras", ".h5"):
        raise UserError(f"baseline.from: {path}: expected a .keras or .h5 file, a Keras SavedModel directory, "
                        "a Stable-Baselines3 DQN .zip, a PyTorch state dict (.pt, .pth, .cleanrl_model) "
                        "or an .onnx file")
    if path.is_file() and path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise UserError(f"baseline.from: {path}: not a zip-format .keras file (a damaged file, or HDF5 bytes "
                        "under a .keras name); save it again with model.save('q.keras'), or name an HDF5 file .h5")
    try:
        with quiet_stderr(), SafeModeScope(True):
            model = tf_keras.models.load_model(str(path), compile=False)
    except Exception as exc:  # tf_keras raises many kinds for bad files; all mean "cannot load"
        if "Lambda layer" in str(exc):
            raise UserError(f"baseline.from: {path}: it has a Lambda layer, which would run Python code stored in "
                            "the file; rebuild the network from standard layers (Dense, Conv2D, ...)") from None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        hint = ("; a SavedModel must be a Keras one (model.save(dir)): a bare tf.Module has no layers to compress"
                if path.is_dir() else "")
        raise UserError(f"baseline.from: {path}: tf_keras cannot load it ({reason}){hint}") from None
    if not isinstance(model, tf_keras.Model):
        raise UserError(f"baseline.from: {path}: loaded a {type(model).__name__}, not a tf_keras model")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UserError(f"baseline.from: {path}: the model has {len(model.inputs)} inputs and {len(model.outputs)} "
                        "outputs; a Q-network maps one observation input to one Q-value output")
    in_shape, out_shape = _shape(model.input_shape[1:]), _shape(model.output_shape[1:])
    problems = []
    if in_shape != tuple(info.obs_shape):
        problems.append(f"its input shape is {in_shape} but {info.env_id} observations are {tuple(info.obs_shape)}")
    if out_shape != (info.n_actions,):
        problems.append(f"its output shape is {out_shape} but {info.env_id} has {info.n_actions} actions "
                        f"(expected ({info.n_actions},): one Q-value per action)")
    if problems:
        raise UserError(f"baseline.from: {path}: " + "; ".join(problems))
    return model
