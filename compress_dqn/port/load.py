"""Which kind of policy a user gave (Keras, SB3 zip, PyTorch state dict, ONNX, TF-Agents, RLlib), and its port to tf_keras.

The kind is decided once, here, from what the file is (zip members, magic bytes), with the suffix
only as a tie-breaker: an RL Zoo download renamed .pt, or a .keras that is really HDF5, still goes
to the right reader; a directory is told apart by the files each library writes into it. Each foreign
format becomes a PortedNet and one builder makes the Keras model; a file saved by Keras 3, which
tf_keras cannot load, is ported too.
A Port's `reference` gives the source's own runtime (torch, SB3, onnxruntime, the SavedModel's
`action` signature) for the port check, or the reason it cannot run here.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port import cleanrl, keras3, onnx_net, rllib, sb3, tfagents
from compress_dqn.port.keras3_file import is_keras3
from compress_dqn.port.spec import build_keras
from compress_dqn.port.tensor_pickle import read_file, read_state_dict
from compress_dqn.store.layout import RunLayout

KINDS = {"sb3": "a Stable-Baselines3 DQN zip", "torch": "a PyTorch state dict", "onnx": "an ONNX model",
         "tfagents": "a TF-Agents PolicySaver SavedModel", "rllib": "an RLlib DQN checkpoint",
         "keras3": "a Keras 3 model file"}


def _dir_kind(path: Path) -> str:
    """'run', 'tfagents', 'rllib', 'keras3' (its model.export() directory) or 'keras' (a SavedModel)
    for a directory; any other refused."""
    if RunLayout.find(path) is not None:
        return "run"
    if tfagents.is_policy_saver(path):
        return "tfagents"
    if rllib.is_rllib(path):
        return "rllib"
    if (path / "saved_model.pb").is_file():
        return "keras3" if is_keras3(path) else "keras"
    raise UserError(f"baseline.from: {path}: a directory that is no compress-dqn run, no SavedModel (no "
                    "saved_model.pb), no TF-Agents PolicySaver directory and no RLlib checkpoint or RLModule "
                    "directory; pass one of those or a model file")


def file_kind(path: Path) -> str:
    """'keras' (a tf_keras .keras/.h5 file or SavedModel directory), 'keras3' (saved by Keras 3, or its
    model.export() directory), 'run', 'tfagents', 'rllib', 'sb3', 'torch' or 'onnx'."""
    if path.is_dir():
        return _dir_kind(path)
    if not path.is_file():  # a FIFO or device would block or never end
        raise UserError(f"baseline.from: {path}: not a regular file; give a model file or a SavedModel directory")
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as exc:
        raise UserError(f"baseline.from: {path}: cannot be read ({exc.strerror}); check its permissions") from None
    if head.startswith(b"\x89HDF"):
        return "keras3" if is_keras3(path) else "keras"
    if zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (zipfile.BadZipFile, OSError) as exc:
            raise UserError(f"baseline.from: {path}: a damaged zip ({str(exc)[:80]}); download or save it again") from None
        if "data" in names and "policy.pth" in names:
            return "sb3"
        if path.suffix == ".zip":  # checked first: a truncated SB3 zip can read as the torch archive inside it
            raise UserError(f"baseline.from: {path}: a zip without SB3's data and policy.pth entries (or a damaged "
                            "one); expected a Stable-Baselines3 model.save() zip")
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "torch"
        return "keras3" if is_keras3(path) else "keras"
    if path.suffix == ".onnx":
        return "onnx"
    if path.suffix in (".pt", ".pth", ".cleanrl_model"):
        return "torch"  # the state-dict reader names what is wrong with it (legacy format, not a zip)
    return "keras"


@dataclass
class Port:
    """A foreign policy read and ported: the net, and how to run the source for the check."""

    kind: str
    net: Any
    reference: Callable[[], Callable[[np.ndarray], np.ndarray]]
    runtime: Callable[[], str]
    format: str = ""
    """What the file is, for the record (KINDS[kind] unless the reader knows more)."""
    gives_actions: bool = False
    """The reference gives greedy actions, not Q-values (a SavedModel's `action` signature)."""

    def __post_init__(self) -> None:
        self.format = self.format or KINDS[self.kind]


def _need(module: str, extra: str, purpose: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ImportError(f"{module} is not installed (pip install 'compress-dqn[{extra}]' to {purpose})")


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"{module} {version(module)}"
    except PackageNotFoundError:
        return module


def read_port(path: Path, info: Any, kind: str) -> Port:
    """Read a foreign policy file into a PortedNet (no torch, SB3, onnxruntime, Keras 3, tf-agents or ray
    needed)."""

    if kind == "keras3":
        net, transposed, fmt = keras3.read_keras3(path, tuple(info.obs_shape))
        return Port(kind, net, lambda: keras3.reference(path, transposed), keras3.keras3_version, fmt)
    label = f"baseline.from: {path}"
    if kind == "tfagents":
        return Port(kind, tfagents.read_tfagents(path, label), lambda: tfagents.reference(path),
                    lambda: f"{_version('tensorflow')} (the SavedModel's action signature)", gives_actions=True)
    if kind == "rllib":
        net = rllib.read_rllib(path, label, tuple(info.obs_shape))

        def rllib_reference() -> Callable[[np.ndarray], np.ndarray]:
            _need("torch", "torch", "cross-check against RLlib's forward pass in torch")
            return rllib.reference(path, label)

        return Port(kind, net, rllib_reference, lambda: f"{_version('torch')} (RLlib's DQN forward pass, unfolded)")
    data = read_file(path)
    if kind == "sb3":
        policy = sb3.SB3Policy(path, data)
        net = policy.ported(tuple(info.obs_shape), getattr(info, "atari", None), getattr(info, "atari_settings", None))
        modules = ("stable_baselines3",) + (("sb3_contrib",) if policy.algorithm == "QR-DQN" else ()) + ("torch",)

        def sb3_reference() -> Callable[[np.ndarray], np.ndarray]:
            for module in modules:
                _need(module, "sb3", "cross-check against SB3")
            return sb3.reference(policy)

        return Port(kind, net, sb3_reference, lambda: ", ".join(_version(m.replace("_", "-")) for m in modules),
                    KINDS[kind] if policy.algorithm == "DQN" else "an sb3-contrib QR-DQN zip")
    if kind == "torch":
        state = read_state_dict(data, label)
        net, order, transposed = cleanrl.infer(state, label, tuple(info.obs_shape), info.obs_dtype, info.n_actions)

        def torch_reference() -> Callable[[np.ndarray], np.ndarray]:
            _need("torch", "torch", "cross-check against PyTorch")
            return cleanrl.reference(data, order, transposed, net.input_scale)

        return Port(kind, net, torch_reference, lambda: _version("torch"))
    net, transposed = onnx_net.read_onnx(path, data, tuple(info.obs_shape))

    def onnx_reference() -> Callable[[np.ndarray], np.ndarray]:
        _need("onnxruntime", "onnx", "cross-check against onnxruntime")
        return onnx_net.reference(data, transposed)

    return Port(kind, net, onnx_reference, lambda: _version("onnxruntime"))


def port_model(path: Path, info: Any, kind: str) -> Any:
    """The tf_keras model of a foreign policy file, taking the environment's raw observations."""

    port = read_port(path, info, kind)
    name = re.sub(r"[^A-Za-z0-9_]", "_", path.stem) or "ported"
    model = build_keras(port.net, tuple(info.obs_shape), f"{name}_ported")
    out = model.output_shape[1:]
    if tuple(out) != (info.n_actions,):
        raise UserError(f"baseline.from: {path}: the network gives {tuple(out)} outputs but {info.env_id} has "
                        f"{info.n_actions} actions")
    return model

