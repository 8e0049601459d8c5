"""SavedModel policies: the TensorFlow runtime loader, and their GPU latency and memory.

A SavedModel is code: load one only from a source you trust.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from compress_dqn._tf import tf
from compress_dqn.deploy.tflite.reader import SIGNATURE
from compress_dqn.errors import UserError
from compress_dqn.evaluation.figures import LatencyStats
from compress_dqn.evaluation.measure import measure_latency


class SavedModelPolicy:
    """A SavedModel policy run by TensorFlow (imported on first use)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not (path / "saved_model.pb").exists():
            raise UserError(f"{path}: not a SavedModel directory (no saved_model.pb); pass a .tflite file or a SavedModel dir")
        try:
            loaded = tf.saved_model.load(str(path))
        except Exception as exc:  # TensorFlow raises many types for corrupt files
            raise UserError(f"{path}: TensorFlow cannot load this SavedModel ({type(exc).__name__}); is it complete?") from None
        if SIGNATURE not in loaded.signatures:
            raise UserError(f"{path}: no {SIGNATURE!r} signature (has {sorted(loaded.signatures)}); export it with compress-dqn")
        self._loaded = loaded  # keep the variables alive
        self._fn = loaded.signatures[SIGNATURE]
        args = self._fn.structured_input_signature[1]
        outputs = self._fn.structured_outputs
        if len(args) != 1 or not {"q_values", "action"} <= set(outputs):
            raise UserError(
                f"{path}: signature {SIGNATURE!r} maps {sorted(args)} -> {sorted(outputs)}; "
                "expected one observation input -> q_values, action"
            )
        (self._input_name, spec), = args.items()
        self.obs_shape = tuple(int(d) for d in spec.shape[1:])
        self.n_actions = int(outputs["q_values"].shape[-1])
        self.input_dtype = np.dtype(spec.dtype.as_numpy_dtype)
        self._tf = tf

    def _call(self, obs: np.ndarray) -> dict:
        return self._fn(**{self._input_name: self._tf.constant(np.asarray(obs, dtype=self.input_dtype))})

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return self._call(obs)["q_values"].numpy()

    def actions(self, obs: np.ndarray) -> np.ndarray:
        return self._call(obs)["action"].numpy()

    def act(self, obs: np.ndarray) -> int:
        return int(self._call(np.asarray(obs)[None])["action"].numpy()[0])


def gpu_note() -> str | None:
    """None when TensorFlow sees a GPU, else the reason GPU figures are missing."""
    return None if tf.config.list_physical_devices("GPU") else "no GPU on this machine"


@dataclass(frozen=True)
class GpuMeasurement:
    """A SavedModel policy on the first GPU: its batch-1 latency and TensorFlow's allocator peak."""

    latency: LatencyStats
    peak_bytes: int
    device: str


def measure_gpu(saved_model: Path, observations: np.ndarray, calls: int = 2000,
                seconds: float | None = None) -> GpuMeasurement | None:
    """SavedModel inference on the first GPU: batch-1 latency and peak GPU memory around it.

    None where TensorFlow sees no GPU (the caller records gpu_note()'s reason instead).
    Peak memory is TensorFlow's allocator peak, reset just before loading the policy.
    """
    if not tf.config.list_physical_devices("GPU"):
        return None
    device = "GPU:0"
    tf.config.experimental.reset_memory_stats(device)
    with tf.device(f"/{device}"):
        policy = SavedModelPolicy(saved_model)
        latency = measure_latency(policy, observations, calls=calls, seconds=seconds)
    return GpuMeasurement(latency, int(tf.config.experimental.get_memory_info(device)["peak"]), device)
