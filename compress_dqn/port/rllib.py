"""RLlib DQN checkpoints (new API stack, torch): the RLModule's encoder and heads folded into one Q-network.

`algo.save_to_path(dir)` writes a tree of pickles. Two of them describe the Q-network: the module's
weights, `module_state.pkl` (a dict of numpy arrays), and its settings, `class_and_ctor_args.pkl`
(the module's class, spaces and model_config, the activations among them, which the weights
cannot say). Both are read through the restricted reader (tensor_pickle.py): every class they
name under ray.rllib, gymnasium.spaces or numpy.random becomes an inert record, nothing is
imported or called, and any other global is refused. The reader needs no ray.

Ported: DefaultDQNTorchRLModule with an MLP encoder (fcnet_hiddens, fcnet_activation: RLlib's
default tanh, or relu, linear) and a plain Q head or dueling heads. RLlib's dueling Q-values are
V(h) + A(h) - mean(A(h)); with linear output layers that is one linear layer,
W = W_a - mean_rows(W_a) + W_v, b = b_a - mean(b_a) + b_v, and head hidden layers
(head_fcnet_hiddens) run side by side in one wider layer (the two streams' weights block-diagonal),
so the fold is exact. Refused in one line each: num_atoms > 1 (distributional), a CNN encoder, an
LSTM, layer norm, noisy layers or any tensor the fold does not know, other activations, and
env-to-module connectors that change the observation (a mean-std filter, frame stacking), by name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port.spec import Layer, PortedNet
from compress_dqn.port.tensor_pickle import Inert, read_restricted_pickle

MODULE_IN_CHECKPOINT = Path("learner_group/learner/rl_module")
CONNECTORS = Path("env_runner/env_to_module_connector/class_and_ctor_args.pkl")
DQN_MODULE = "ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module.DefaultDQNTorchRLModule"
INERT = ("ray.rllib.", "gymnasium.spaces.", "numpy.random.", "torch")
"""Globals these pickles name that become inert records (RLlib's classes, spaces, their RNG, a torch device)."""
DEFAULTS: dict[str, Any] = {"fcnet_activation": "tanh", "head_fcnet_hiddens": [], "head_fcnet_activation": "relu",
                            "conv_filters": None, "num_atoms": 1, "dueling": True, "use_lstm": False,
                            "fcnet_use_layernorm": False, "head_fcnet_use_layernorm": False, "noisy": False}
"""RLlib 2.x's defaults (DefaultModelConfig, DQNConfig) for the keys a model_config may leave out."""
_ACTIVATIONS = {"tanh": "tanh", "relu": "relu", "linear": "linear", None: "linear"}
_PLAIN_CONNECTORS = {"AddObservationsFromEpisodesToBatch", "AddTimeDimToBatchAndZeroPad", "AddStatesFromEpisodesToBatch",
                     "BatchIndividualItems", "NumpyToTensor", "AgentToModuleMapping", "EnvToModulePipeline"}
"""RLlib's default env-to-module pieces: they batch and convert, the observation's values pass unchanged."""


def is_rllib(path: Path) -> bool:
    """A checkpoint directory (rllib_checkpoint.json) or an RLModule directory (its two pickles, or one module's)."""
    return ((path / "rllib_checkpoint.json").is_file() or (path / "module_state.pkl").is_file()
            or any((sub / "module_state.pkl").is_file() for sub in _subdirs(path)))


def _subdirs(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir())
    except OSError:
        return []


def module_dir(path: Path, label: str) -> Path:
    """The single-agent module's directory in a checkpoint, a MultiRLModule directory or itself."""
    if (path / "rllib_checkpoint.json").is_file():
        if not (path / MODULE_IN_CHECKPOINT).is_dir():
            raise UserError(f"{label}: an RLlib checkpoint without {MODULE_IN_CHECKPOINT} (an old API stack "
                            "checkpoint?); ported: new API stack DQN checkpoints (algo.save_to_path())")
        path = path / MODULE_IN_CHECKPOINT
    modules = [sub for sub in _subdirs(path) if (sub / "module_state.pkl").is_file()]
    if modules:
        if len(modules) > 1:
            raise UserError(f"{label}: holds {len(modules)} RLModules ({', '.join(m.name for m in modules)}); "
                            "pass one module's directory")
        path = modules[0]
    for name in ("module_state.pkl", "class_and_ctor_args.pkl"):
        if not (path / name).is_file():
            raise UserError(f"{label}: {path / name} is missing; not an RLlib RLModule directory")
    return path


def _read(path: Path, label: str) -> Any:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{label}: {path.name} cannot be read ({exc.strerror})") from None
    return read_restricted_pickle(data, f"{label}: {path.name}", INERT)


def _name(value: Any) -> str:
    if isinstance(value, type) and issubclass(value, Inert):
        return value.global_name
    return type(value).global_name if isinstance(value, Inert) else type(value).__name__


def _state(value: Any) -> dict:
    """The fields an inert record holds (its pickled state), or a plain dict as it is."""
    if isinstance(value, dict):
        return value
    state = getattr(value, "state", None)
    return state if isinstance(state, dict) else {}


def _settings(path: Path, label: str) -> tuple[dict[str, Any], tuple[int, ...], int]:
    """model_config with RLlib's defaults, the observation shape and the number of actions."""
    saved = _read(path / "class_and_ctor_args.pkl", label)
    if not isinstance(saved, dict) or "ctor_args_and_kwargs" not in saved:
        raise UserError(f"{label}: class_and_ctor_args.pkl is not RLlib's (no ctor_args_and_kwargs)")
    cls = _name(saved.get("class"))
    if cls.rsplit(".", 1)[-1] != DQN_MODULE.rsplit(".", 1)[-1]:
        raise UserError(f"{label}: an RLModule of {cls}; ported: RLlib's DQN module ({DQN_MODULE}, torch)")
    args, kwargs = saved["ctor_args_and_kwargs"]
    kwargs = dict(kwargs) if isinstance(kwargs, dict) else {}
    config = {**DEFAULTS, **_state(kwargs.get("model_config"))}
    observation, action = _state(kwargs.get("observation_space")), _state(kwargs.get("action_space"))
    if _name(kwargs.get("observation_space")).rsplit(".", 1)[-1] != "Box" or "_shape" not in observation:
        raise UserError(f"{label}: its observation space is {_name(kwargs.get('observation_space'))}; ported: a Box")
    if _name(kwargs.get("action_space")).rsplit(".", 1)[-1] != "Discrete" or "n" not in action:
        raise UserError(f"{label}: its action space is {_name(kwargs.get('action_space'))}; a DQN needs Discrete")
    return config, tuple(int(d) for d in observation["_shape"]), int(action["n"])


def _check_config(config: dict[str, Any], obs_shape: tuple[int, ...], label: str) -> None:
    if int(config.get("num_atoms") or 1) > 1:
        raise UserError(f"{label}: num_atoms {config['num_atoms']} (distributional DQN); not ported: a plain "
                        "Q-network needs num_atoms 1")
    refused = [("use_lstm", "an LSTM (use_lstm)"), ("fcnet_use_layernorm", "layer norm (fcnet_use_layernorm)"),
               ("head_fcnet_use_layernorm", "layer norm (head_fcnet_use_layernorm)"), ("noisy", "noisy layers (noisy)")]
    for key, what in refused:
        if config.get(key):
            raise UserError(f"{label}: {what}; not ported: an MLP encoder with plain or dueling heads is")
    if config.get("conv_filters") or len(obs_shape) != 1:
        raise UserError(f"{label}: a CNN encoder (observations {obs_shape}, conv_filters {config.get('conv_filters')}); "
                        "not ported: RLlib's MLP encoder on flat observations is")
    for key in ("fcnet_activation", "head_fcnet_activation"):
        value = config.get(key)
        if not (value is None or isinstance(value, str)) or (value.lower() if value else None) not in _ACTIVATIONS:
            raise UserError(f"{label}: {key} {value!r}; ported activations: tanh, relu, linear")


def check_connectors(module: Path, label: str) -> list[str]:
    """Refuse, by name, env-to-module connectors that change the observation; the notes on what was checked."""
    root = next((p for p in [module, *module.parents][:5] if (p / "rllib_checkpoint.json").is_file()), None)
    if root is None or not (root / CONNECTORS).is_file():
        return ["an RLModule directory outside its checkpoint: its env-to-module connectors were not checked"]
    pieces: list[str] = []

    def walk(value: Any) -> None:
        name = _name(value)
        if name.startswith("ray.rllib.connectors."):
            pieces.append(name.rsplit(".", 1)[-1])
        items = value.items() if isinstance(value, dict) else None
        if items is not None:
            for key, item in items:
                walk(key)
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)
        elif isinstance(value, Inert):
            walk(getattr(value, "args", ()))
            walk(getattr(value, "state", None))

    walk(_read(root / CONNECTORS, label))
    changing = sorted(set(pieces) - _PLAIN_CONNECTORS)
    if changing:
        raise UserError(f"{label}: its env-to-module connector {', '.join(changing)} changes the observation the "
                        "module sees; not folded into the port: train without it (or normalize in the environment)")
    return [f"env-to-module connectors checked: {', '.join(sorted(set(pieces)))} pass observations unchanged"]


def _stack(state: dict[str, np.ndarray], prefix: str, label: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """The Linear layers of one TorchMLP (prefix.net.mlp.<i>.weight/bias), in order."""
    index = sorted({int(m.group(1)) for k in state if (m := re.fullmatch(re.escape(prefix) + r"\.net\.mlp\.(\d+)\.weight", k))})
    layers = []
    for i in index:
        weight, bias = state[f"{prefix}.net.mlp.{i}.weight"], state.get(f"{prefix}.net.mlp.{i}.bias")
        if weight.ndim != 2:
            raise UserError(f"{label}: {prefix}.net.mlp.{i}.weight has shape {weight.shape}; not a Linear layer")
        layers.append((weight.astype(np.float64), (bias if bias is not None else np.zeros(len(weight))).astype(np.float64)))
    return layers


def _weights(module: Path, label: str) -> dict[str, np.ndarray]:
    state = _read(module / "module_state.pkl", label)
    if not isinstance(state, dict):
        raise UserError(f"{label}: module_state.pkl holds a {_name(state)}, not a dict of arrays")
    online = {}
    for key, value in state.items():
        if str(key).startswith("_target_") or str(key).endswith("log_std_clip_param_const"):
            continue  # the target network, and a constant the Q-heads never use
        if not isinstance(value, np.ndarray):
            raise UserError(f"{label}: module_state.pkl's {key} is a {_name(value)}, not an array")
        if not re.fullmatch(r"(encoder|af|vf)\.net\.mlp\.\d+\.(weight|bias)", str(key)):
            raise UserError(f"{label}: module_state.pkl holds {key}, which the port does not know (ported: an MLP "
                            "encoder and af/vf heads of Linear layers)")
        online[str(key)] = value
    return online


def _fold_heads(af: list[tuple[np.ndarray, np.ndarray]], vf: list[tuple[np.ndarray, np.ndarray]],
                n_actions: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The dueling streams as one stack of (out, in) Linear layers computing V + A - mean(A), exactly."""
    if not vf:
        return af
    layers = []
    for depth, ((wa, ba), (wv, bv)) in enumerate(zip(af[:-1], vf[:-1])):
        if depth == 0:  # both streams read the encoder's output: stacked side by side
            layers.append((np.vstack([wa, wv]), np.concatenate([ba, bv])))
        else:  # each stream reads its own units: block-diagonal
            weight = np.zeros((wa.shape[0] + wv.shape[0], wa.shape[1] + wv.shape[1]))
            weight[:wa.shape[0], :wa.shape[1]], weight[wa.shape[0]:, wa.shape[1]:] = wa, wv
            layers.append((weight, np.concatenate([ba, bv])))
    (wa, ba), (wv, bv) = af[-1], vf[-1]
    advantage = wa - wa.mean(axis=0, keepdims=True)
    value = np.repeat(wv, n_actions, axis=0)
    if len(af) == 1:
        return [(advantage + value, ba - ba.mean() + bv)]
    return layers + [(np.hstack([advantage, value]), ba - ba.mean() + bv)]


def read_rllib(path: Path, label: str, obs_shape: tuple[int, ...]) -> PortedNet:
    """The DQN module of a checkpoint or RLModule directory as one Q-network in Keras layout."""
    module = module_dir(path, label)
    config, saved_shape, n_actions = _settings(module, label)
    _check_config(config, saved_shape, label)
    if tuple(obs_shape) != saved_shape:
        raise UserError(f"{label}: RLlib saved observations of shape {saved_shape}, the environment gives "
                        f"{tuple(obs_shape)}; check --env")
    notes = check_connectors(module, label)
    state = _weights(module, label)
    encoder, af, vf = (_stack(state, name, label) for name in ("encoder", "af", "vf"))
    dueling = bool(config.get("dueling"))
    if not encoder or not af or (dueling and len(vf) != len(af)) or (not dueling and vf):
        raise UserError(f"{label}: module_state.pkl has {len(encoder)} encoder, {len(af)} advantage and {len(vf)} "
                        f"value layers, not the {'dueling' if dueling else 'plain'} DQN its model_config says")
    head = _fold_heads(af, vf, n_actions)
    if head[-1][0].shape[0] != n_actions:
        raise UserError(f"{label}: its Q head gives {head[-1][0].shape[0]} outputs for {n_actions} actions")
    body = _ACTIVATIONS[(config.get("fcnet_activation") or "linear").lower()]
    head_act = _ACTIVATIONS[(config.get("head_fcnet_activation") or "linear").lower()]
    activations = [body] * len(encoder) + [head_act] * (len(head) - 1) + ["linear"]
    layers = [Layer(np.ascontiguousarray(w.T, dtype=np.float32), b.astype(np.float32), act)
              for (w, b), act in zip(encoder + head, activations)]
    net = PortedNet(layers, None, label)
    net.notes += [f"RLlib DQN module: encoder {[len(b) for _, b in encoder]} ({body}), "
                  + ("dueling heads folded exactly into one Q layer (V + A - mean A)" if dueling else "a plain Q head")]
    net.notes += notes
    return net


def reference(path: Path, label: str) -> Any:
    """RLlib's DQN forward pass in torch on the module's own arrays, unfolded: the encoder, the advantage and
    value streams and their combination as DefaultDQNTorchRLModule computes them (ray itself is not needed)."""
    import torch

    module = module_dir(path, label)
    config, _, _ = _settings(module, label)
    state = {k: torch.as_tensor(v) for k, v in _weights(module, label).items()}
    acts = {name: {"tanh": torch.tanh, "relu": torch.relu}.get((config.get(key) or "linear").lower(), lambda x: x)
            for name, key in (("body", "fcnet_activation"), ("head", "head_fcnet_activation"))}

    def mlp(x: Any, prefix: str, hidden: Any) -> Any:
        index = sorted({int(k.split(".")[3]) for k in state if k.startswith(prefix + ".") and k.endswith("weight")})
        for n, i in enumerate(index):
            x = torch.nn.functional.linear(x, state[f"{prefix}.net.mlp.{i}.weight"], state.get(f"{prefix}.net.mlp.{i}.bias"))
            if prefix == "encoder" or n < len(index) - 1:
                x = hidden(x)
        return x

    def q_values(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            h = mlp(torch.as_tensor(np.asarray(obs, dtype=np.float32)), "encoder", acts["body"])
            a = mlp(h, "af", acts["head"])
            if config.get("dueling"):
                a = a - a.mean(dim=-1, keepdim=True) + mlp(h, "vf", acts["head"])
        return a.numpy()

    return q_values
