"""Any policy artifact by its path: a .tflite file (LiteRT alone) or a SavedModel directory (TensorFlow)."""

from __future__ import annotations

from pathlib import Path

from compress_dqn.deploy.litert.policy import Policy, TFLitePolicy
from compress_dqn.errors import UserError


def load_policy(path: str | Path, num_threads: int = 1) -> Policy:
    """A .tflite file or a SavedModel directory, chosen by what the path is. A .tflite never imports
    TensorFlow: `evaluate` and `bench` on one stay a LiteRT process of megabytes."""
    path = Path(path)
    if path.is_dir():
        from compress_dqn.convert.saved_model import SavedModelPolicy  # TensorFlow: only for a SavedModel

        return SavedModelPolicy(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory; pass a .tflite file or a SavedModel dir")
    return TFLitePolicy(path, num_threads=num_threads)
