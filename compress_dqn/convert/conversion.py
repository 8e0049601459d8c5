"""Conversion: a Keras Q-network into a slim SavedModel and a TFLite policy, both with one `serving_default` signature.

The signature maps an observation batch `[None, *obs_shape]` (the environment's dtype) to
`{"q_values": float32 [None, n_actions], "action": int32 [None]}`. The SavedModel tracks only
the network's variables, not the Keras objects, optimizer or training graph, so it holds the
weights and one inference function. Both are written under a temporary name and renamed; a
full or read-only disk is one WriteRefused line (fileio.refused_writes), the temporary removed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from compress_dqn._tf import quiet_stderr, tf, tf_keras
from compress_dqn.deploy.tflite.graph_input import carry_normalization
from compress_dqn.deploy.tflite.outputs import action_from_q_values, float_q_values
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.deploy.tflite.file import TFLiteFile
from compress_dqn.deploy.tflite.metadata import short_tensor_names
from compress_dqn.deploy.tflite.reader import SIGNATURE
from compress_dqn.deploy.tflite.weight_only import int8_weight_only
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError
from compress_dqn.fileio import refused_writes, replace_dir, write_bytes_atomic

INPUT_NAME = "observations"


def serving_module(model: tf_keras.Model, obs_shape: Sequence[int], obs_dtype: np.dtype) -> tf.Module:
    """A tf.Module holding only the model's variables and the serving function."""
    module = tf.Module()
    module.weights = list(model.weights)  # track variables only: no Keras metadata is saved

    @tf.function(input_signature=[tf.TensorSpec([None, *obs_shape], tf.as_dtype(np.dtype(obs_dtype)), name=INPUT_NAME)])
    def serve(observations):
        outputs = model(tf.cast(observations, tf.float32), training=False)
        if isinstance(outputs, (list, tuple)):  # split head: act on the advantage's finer range
            advantage, value = outputs[:2]
            chooser = outputs[2] if len(outputs) == 3 else advantage  # compress.rewrites.with_action_head's, where there is one
            return {"q_values": advantage + value, "action": tf.argmax(chooser, axis=-1, output_type=tf.int32)}
        return {"q_values": outputs, "action": tf.argmax(outputs, axis=-1, output_type=tf.int32)}

    module.serve = serve
    return module


def export_saved_model(model: tf_keras.Model, obs_shape: Sequence[int], obs_dtype: np.dtype, path: Path) -> Path:
    """Write a slim SavedModel directory at path (atomically)."""
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    module = serving_module(model, obs_shape, obs_dtype)
    try:
        # The SavedModel writer raises OSError for some files and tf.errors.OpError for others.
        with refused_writes(path, also=(tf.errors.OpError,)):
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            with quiet_stderr():
                tf.saved_model.save(module, str(tmp), signatures={SIGNATURE: module.serve})
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the previous complete export, if any, stays
        raise
    return path


def convert_tflite(
    saved_model_dir: Path,
    configure: Callable[[tf.lite.TFLiteConverter], None] | None = None,
    slim_names: bool = True,
) -> bytes:
    """A SavedModel's serving signature as TFLite flatbuffer bytes (fp32 unless `configure` says
    otherwise), inner tensors named by index (see tflite_metadata.short_tensor_names)."""
    if not slim_names:
        return _converter_output(saved_model_dir, configure)
    return converted(saved_model_dir, configure).pack()


def converted(saved_model_dir: Path, configure: Callable[[tf.lite.TFLiteConverter], None] | None = None) -> TFLiteFile:
    """The converter's output decoded once, inner tensors named by index: the object every later edit changes."""
    model = TFLiteFile.decode(_converter_output(saved_model_dir, configure), f"{saved_model_dir} converted")
    short_tensor_names(model)
    return model


def _converter_output(saved_model_dir: Path, configure: Callable[[tf.lite.TFLiteConverter], None] | None) -> bytes:
    """The TFLite converter's bytes for the serving signature."""
    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model_dir), signature_keys=[SIGNATURE])
    if configure is not None:
        configure(converter)
    with quiet_stderr():
        return converter.convert()


def same_policy(candidate: bytes, reference: bytes, observations: Any) -> bool:
    """Whether a TFLite encoding loads in the runtime (XNNPACK) and computes what the reference does."""
    try:
        policy = TFLitePolicy(candidate)
        got, actions = policy.q_values(observations), policy.actions(observations)
    except (UserError, RuntimeError, ValueError):
        return False
    expected = TFLitePolicy(reference)
    # The actions too: with an action head (quantize.action_head) they come from a tensor q_values does not show.
    return bool(np.allclose(got, expected.q_values(observations), rtol=1e-4, atol=1e-4)
                and np.array_equal(actions, expected.actions(observations)))


class Conversion(Protocol):
    """How a compressed model converts to TFLite (compress.build.BuiltVariant is one): the model to
    convert, the converter settings, and the input normalization the file must carry."""

    input_normalization: Normalization | None
    try_sparse_format: bool

    @property
    def converts_own_model(self) -> bool: ...
    @property
    def weight_only(self) -> bool: ...
    def tflite_model(self) -> tf_keras.Model: ...
    def converter(self, sparse: bool = False) -> Callable[[tf.lite.TFLiteConverter], None]: ...


def convert_policy(model: tf_keras.Model, info: EnvInfo, out: Path, built: Conversion | None = None,
                  check_obs: np.ndarray | None = None) -> dict[str, bool]:
    """SavedModel + TFLite for one model (a BuiltVariant says how to convert; None: fp32).

    Both take raw observations. The TFLite file is converted from built.tflite_model(), which
    takes normalized observations where the variant has an input normalization (the file gets it
    back as ops in front of its input: graph_input.carry_normalization), stores its kernels in int8
    where it is weight-only (deploy.tflite.weight_only), and chooses the
    action on its own head where it has one (quantize.action_head). With built.try_sparse_format,
    the TFLite sparse weight format is kept only if it is smaller AND the runtime loads it and
    computes the same Q-values (XNNPACK cannot prepare every sparse layout).
    """
    export_saved_model(model, info.obs_shape, info.obs_dtype, out / "saved_model")
    source = out / "saved_model"
    with refused_writes(out):
        scratch_dir = tempfile.TemporaryDirectory(dir=out, prefix=".tmp-export-")
    with scratch_dir as scratch:
        if built is not None and built.converts_own_model:
            dtype = np.float32 if built.input_normalization is not None else info.obs_dtype
            source = export_saved_model(built.tflite_model(), info.obs_shape, dtype, Path(scratch) / "converted")

        def convert(sparse: bool) -> bytes:  # decoded once, every edit in place, packed once
            model = converted(source, built.converter(sparse) if built is not None else None)
            if built is not None and built.weight_only:
                int8_weight_only(model)
            if built is not None and built.input_normalization is not None:
                carry_normalization(model, built.input_normalization)
            float_q_values(model)  # argmax(q_values) is the action (deploy.tflite.outputs)
            action_from_q_values(model)
            return model.pack()

        data = convert(False)
        sparse_format = False
        if built is not None and built.try_sparse_format and check_obs is not None:  # kept only if checked
            sparse = convert(True)
            if len(sparse) < len(data) and same_policy(sparse, data, check_obs):
                data, sparse_format = sparse, True
    write_bytes_atomic(out / "policy.tflite", data)
    return {"sparse_format": sparse_format}
