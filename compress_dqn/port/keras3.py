"""A Keras 3 .keras or .h5 Q-network ported: config checked, weights read, layers folded; Keras 3's own forward pass.

The order is the safety: the config is parsed as data and checked against the allowed layers
(keras3_graph) before anything else; the weights come through h5py; Keras 3's loader runs only
for the port check, in safe mode, on a file whose config has passed that check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from compress_dqn.port.keras3_file import Keras3File
from compress_dqn.port.keras3_graph import read_graph
from compress_dqn.port.keras3_net import fold
from compress_dqn.port.spec import PortedNet


def read_keras3(path: Path, obs_shape: tuple[int, ...]) -> tuple[PortedNet, bool, str]:
    """The ported net, whether it took channel-first frames of the env's channel-last ones, and the file's format."""
    file = Keras3File(path)
    graph = read_graph(file.config, file.label)
    net, transposed = fold(graph, file.weights(graph.layers), tuple(obs_shape), file.label)
    return net, transposed, file.format


def keras3_version() -> str:
    """The installed Keras 3 (`keras`, beside tf_keras), as the port check's runtime."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("keras")
    except PackageNotFoundError:
        raise ImportError("keras is not installed (Keras 3 comes with TensorFlow 2.16 and later) to cross-check "
                          "against Keras 3") from None
    if not installed.startswith("3."):
        raise ImportError(f"keras {installed} is installed, not Keras 3, to cross-check against Keras 3")
    return f"keras {installed}"


def reference(path: Path, transposed: bool) -> Callable[[np.ndarray], np.ndarray]:
    """Keras 3's forward pass of the file, loaded in safe mode (its config already checked), on env observations."""
    keras3_version()
    import keras

    try:
        model = keras.saving.load_model(str(path), compile=False, safe_mode=True)
    except Exception as exc:  # Keras 3 raises many kinds; all mean its loader cannot run this file
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        # ImportError: the port check records "not cross-checked" with the reason, as for a missing runtime.
        raise ImportError(f"Keras 3 cannot load the file itself ({reason})") from None

    def q_values(obs: np.ndarray) -> np.ndarray:
        x = np.transpose(obs, (0, 3, 1, 2)) if transposed else np.asarray(obs)
        return np.asarray(model.predict(np.asarray(x, dtype=np.float32), batch_size=256, verbose=0))

    return q_values
