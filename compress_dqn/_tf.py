"""The one place that imports TensorFlow: quiet by default, legacy Keras, thread settings.

Every module that needs TensorFlow imports it from here, so the environment switches are set
before the first import and `--help`, `validate` and the TFLite runtime never pay for it.
Set COMPRESS_DQN_TF_LOGS=1 to see TensorFlow's own start-up logs.
"""

from __future__ import annotations

import contextlib
import os

from compress_dqn._quiet import quiet_stderr

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


with quiet_stderr():
    import tensorflow as tf  # noqa: E402
    import tf_keras  # noqa: E402

    tf.get_logger().setLevel("ERROR")
    # Touch the device list once while stderr is quiet: CUDA probing logs here too. Memory
    # growth on every GPU, so TensorFlow takes what it uses rather than the whole card.
    for _gpu in tf.config.list_physical_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(_gpu, True)
        except RuntimeError:  # already initialised
            pass

__all__ = ["tf", "tf_keras", "configure_device", "configure_threads", "mixed_precision_policy", "use_xla", "set_seed", "quiet_stderr"]


def configure_device(device: str) -> str:
    """Pick where TensorFlow runs: "auto" (a GPU when one is visible), "cpu" or "gpu".

    Returns what was chosen ("gpu" or "cpu"). "cpu" hides the GPUs so no op lands there;
    "gpu" without one is a UserError that says how to get one. Must run before the first op.
    """
    from compress_dqn.errors import UserError

    if device not in ("auto", "cpu", "gpu"):
        raise UserError(f"device: {device!r} is not one of auto, cpu, gpu")
    gpus = tf.config.list_physical_devices("GPU")
    if device == "gpu" and not gpus:
        raise UserError(
            "device: gpu, but TensorFlow sees no GPU; install the CUDA build "
            "(pip install 'compress-dqn[gpu]') and check nvidia-smi, or set device: auto"
        )
    if device == "cpu" and gpus:
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # TensorFlow already initialised its devices in this process
            pass
        return "cpu"
    visible = tf.config.get_visible_devices("GPU")
    return "gpu" if visible else "cpu"


def use_xla(requested: bool | None, convolutional: bool) -> bool:
    """Whether to compile updates with XLA: as asked, else yes unless a CNN runs on the CPU."""
    if requested is not None:
        return requested
    return not convolutional or bool(tf.config.get_visible_devices("GPU"))


def mixed_precision_policy(requested: bool, device: str) -> str:
    """The Keras dtype policy to build training networks under: mixed_float16 only on a GPU.

    On a CPU float16 math is emulated and slower, so the request falls back to float32.
    """
    return "mixed_float16" if requested and device == "gpu" else "float32"


def configure_threads(intra_op: int | None) -> None:
    """Set TensorFlow's intra-op thread count (None keeps TensorFlow's default).

    Units that run side by side take one thread each so that they do not oversubscribe the CPUs;
    one unit alone gains from more (docs/training-cartpole.md). Must run before the first TensorFlow op.
    """
    if intra_op is None:
        return
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(max(1, intra_op))
    except RuntimeError:  # already initialised in this process (tests, notebooks): keep going
        pass


def set_seed(seed: int) -> None:
    """Seed TensorFlow's global generator and make CPU kernels deterministic."""
    tf_keras.utils.set_random_seed(seed)
    with contextlib.suppress(Exception):
        tf.config.experimental.enable_op_determinism()
