"""Stable-Baselines3 DQN and sb3-contrib QR-DQN zips (model.save(), RL Zoo; SB3 1.0 to 2.x): the online Q-network as a PortedNet.

The zip's `data` is JSON whose non-JSON entries (spaces, classes) are cloudpickled; the spaces come
from their readable fields, or where a zip has none from the pickle through the restricted
reader (sb3_spaces.py). Weights come from `policy.pth` (`q_net.*` / `quantile_net.*`, not the target
network's) through the tensor-only reader. QR-DQN acts on the mean of its quantiles, which folds
exactly into its last linear layer, so both become one Q-network. What SB3 does to an observation
inside the policy is reproduced inside the ported network: `/255` for image spaces when
`normalize_images` (SB3's preprocess_obs) and, because SB3 trained on channel-first frames
(VecTransposeImage) while the environment gives height x width x channels, the first Dense layer
after the convolutions takes Keras's flatten order. VecNormalize statistics (vecnormalize.pkl beside
the zip, as the RL Zoo saves them) are read with a restricted unpickler and folded into the first
layer.

An Atari CnnPolicy plays in the environment it was trained in: SB3's AtariWrapper with its frame
stack (envs/atari.py). The RL Zoo's config.yml / args.yml beside the zip (port/zoo_config.py) say which wrapper and
settings; a bare zip is taken as AtariWrapper with SB3's defaults, and anything else that cannot
be matched (another env_wrapper, frames that are not k x 84 x 84) is refused in one line.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
from pydantic import JsonValue

from compress_dqn.envs.atari import SB3_DEFAULTS, AtariSettings, describe
from compress_dqn.envs.environment import is_atari
from compress_dqn.envs.normalization import Normalization
from compress_dqn.errors import UserError
from compress_dqn.port.spec import (
    Layer,
    PortedNet,
    absorb_normalization,
    chw_rows_to_hwc,
    conv_kernel,
    conv_output_hw,
)
from compress_dqn.port.sb3_spaces import numbers, read_spaces, readable
from compress_dqn.port.tensor_pickle import read_restricted_pickle, read_state_dict
from compress_dqn.port.zoo_config import ATARI_WRAPPER, read_zoo
from compress_dqn.recipe.schema import AtariConfig, EnvConfig

NATURE_CNN = ((8, 4), (4, 2), (3, 1))  # (kernel, stride) of NatureCNN's three convolutions
_ACTIVATION_NAMES = {"ReLU": "relu", "Tanh": "tanh"}
ALGORITHMS = {"DQN": "stable_baselines3.dqn", "QR-DQN": "sb3_contrib.qrdqn"}
"""The policy modules read, by algorithm."""
_NETS = {"DQN": "q_net.", "QR-DQN": "quantile_net."}
"""The online network's tensors in policy.pth (not the target's, q_net_target. / quantile_net_target.)."""


def _layers(state: dict[str, np.ndarray], prefix: str) -> list[tuple[np.ndarray, np.ndarray]]:
    index = sorted({int(m.group(1)) for k in state if (m := re.fullmatch(re.escape(prefix) + r"(\d+)\.weight", k))})
    return [(state[f"{prefix}{i}.weight"], state[f"{prefix}{i}.bias"]) for i in index]


class SB3Policy:
    """What a DQN or QR-DQN zip says about its Q-network: spaces, preprocessing and weights."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path = path
        archive = zipfile.ZipFile(io.BytesIO(data))
        try:
            self.data = json.loads(archive.read("data"))
        except ValueError as exc:
            raise UserError(f"baseline.from: {path}: its `data` entry is not JSON ({str(exc)[:80]}); a damaged zip?") from None
        self.pth = archive.read("policy.pth")
        module = str(readable(self.data.get("policy_class"), "__module__", ""))
        algorithm = next((name for name, prefix in ALGORITHMS.items() if module.startswith(prefix)), None if module else "DQN")
        if algorithm is None:
            raise UserError(f"baseline.from: {path}: a policy of {module}; ported: SB3's DQN ({ALGORITHMS['DQN']}) "
                            f"and sb3-contrib's QR-DQN ({ALGORITHMS['QR-DQN']}), MlpPolicy and CnnPolicy")
        self.algorithm = algorithm
        self.spaces = read_spaces(self.data, f"baseline.from: {path}")
        self.obs_shape, self.obs_dtype = self.spaces.obs_shape, self.spaces.obs_dtype
        self.low, self.high, self.n_actions = self.spaces.low, self.spaces.high, self.spaces.n_actions
        kwargs = self.data.get("policy_kwargs") or {}
        self.normalize_images = bool(readable(kwargs, "normalize_images", True))
        activation = str(readable(kwargs, "activation_fn", "ReLU"))
        name = next((n for n in _ACTIVATION_NAMES if re.search(rf"\b{n}\b", activation)), None)
        if name is None:
            raise UserError(f"baseline.from: {path}: activation {activation}; ported activations: "
                            f"{', '.join(_ACTIVATION_NAMES)}")
        self.torch_activation, self.activation_fn = name, _ACTIVATION_NAMES[name]
        extractor = str(readable(kwargs, "features_extractor_class", "") or "")
        if extractor and not re.search(r"\b(NatureCNN|FlattenExtractor)\b", extractor):
            raise UserError(f"baseline.from: {path}: features extractor {extractor}; ported: NatureCNN (CnnPolicy) "
                            "and FlattenExtractor (MlpPolicy)")
        state = read_state_dict(self.pth, f"baseline.from: {path} (policy.pth)")
        net = _NETS[algorithm]
        self.state = {k[len(net):]: v for k, v in state.items() if k.startswith(net)}
        if not self.state:
            raise UserError(f"baseline.from: {path}: policy.pth has no {net}* tensors; not a {algorithm} policy")
        self.head = _layers(self.state, net)
        if not self.head:
            raise UserError(f"baseline.from: {path}: policy.pth has no {net} linear layers")
        self.n_quantiles = self._quantiles(readable(kwargs, "n_quantiles"))
        self._check_input_width()

    def _quantiles(self, said: Any) -> int:
        """QR-DQN's quantiles per action, from the last layer's width (checked against policy_kwargs); 1 for DQN."""
        out = int(self.head[-1][0].shape[0])
        n = out // self.n_actions if self.algorithm == "QR-DQN" else 1
        if out != n * self.n_actions or (said is not None and self.algorithm == "QR-DQN" and numbers(said)[:1] != [n]):
            per = f"{'N' if said is None else said} quantiles x " if self.algorithm == "QR-DQN" else ""
            raise UserError(f"baseline.from: {self.path}: its last layer gives {out} outputs, not {per}"
                            f"{self.n_actions} actions of its action space; a damaged or edited zip?")
        return n

    def _check_input_width(self) -> None:
        """The saved observation space against what the first layer takes (channels or features)."""
        if self.cnn:
            takes, gives = int(self.cnn[0][0].shape[1]), self.obs_shape[0]
            what = f"{takes}-channel frames"
        else:
            first = _layers(self.state, "features_extractor.linear.") + self.head
            takes, gives = int(first[0][0].shape[1]), int(np.prod(self.obs_shape))
            what = f"{takes} inputs"
        if takes != gives:
            raise UserError(f"baseline.from: {self.path}: SB3 saved observations of shape {self.obs_shape} but its "
                            f"first layer takes {what}; a damaged or edited zip?")

    @property
    def is_image(self) -> bool:
        """SB3's is_image_space: 3-D uint8 Box bounded by 0 and 255."""
        return (len(self.obs_shape) == 3 and self.obs_dtype == "uint8" and set(self.low) <= {0.0}
                and set(self.high) <= {255.0})

    def transposed_for(self, env_shape: tuple[int, ...]) -> bool:
        """True when SB3 saw channel-first frames of the environment's channel-last ones (a float table
        the environment flattens, as SB3's FlattenExtractor did, is taken as it is)."""
        flattened = len(env_shape) == 1 and not self.cnn and env_shape[0] == int(np.prod(self.obs_shape))
        if tuple(env_shape) == self.obs_shape or flattened:
            if len(env_shape) == 3 and self.cnn:
                raise UserError(f"baseline.from: {self.path}: the environment gives channel-first {env_shape} frames; "
                                "the ported network takes height x width x channels (the gymnasium default)")
            return False
        c, h, w = self.obs_shape if len(self.obs_shape) == 3 else (0, 0, 0)
        if len(env_shape) == 3 and tuple(env_shape) == (h, w, c):
            return True
        raise UserError(f"baseline.from: {self.path}: SB3 saved observations of shape {self.obs_shape}, "
                        f"the environment gives {tuple(env_shape)}; check --env, --frame-stack and --set env.kwargs")

    @property
    def cnn(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return _layers(self.state, "features_extractor.cnn.")

    @property
    def is_atari_cnn(self) -> bool:
        """A CnnPolicy on 3-D uint8 frames: what an Atari agent is."""
        return self.is_image and bool(self.cnn)

    def dense_layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The Linear layers after the convolutions (torch layout); QR-DQN's mean over quantiles folded into the last.

        sb3-contrib's QuantileNetwork views its last layer's n_quantiles * n_actions outputs as
        (n_quantiles, n_actions) and acts on the mean over quantiles: a mean of linear outputs is the
        linear layer whose weights and bias are the means of those rows, so the fold is exact."""
        head = _layers(self.state, "features_extractor.linear.") + self.head
        if self.algorithm != "QR-DQN":
            return head
        weight, bias = head[-1]
        n, a = self.n_quantiles, self.n_actions
        mean_weight = weight.astype(np.float64).reshape(n, a, -1).mean(axis=0)
        mean_bias = bias.astype(np.float64).reshape(n, a).mean(axis=0)
        return head[:-1] + [(mean_weight.astype(np.float32), mean_bias.astype(np.float32))]

    def ported(self, env_shape: tuple[int, ...], atari: str | None = None,
               played: AtariSettings | None = None) -> PortedNet:
        """The Q-network for an environment giving `env_shape` observations; `atari` and `played`: the
        Atari preprocessing it plays behind and its settings (EnvInfo.atari, .atari_settings), checked
        against the ones it was trained with."""
        atari_note = self._atari_note(atari, tuple(env_shape), played)
        transposed = self.transposed_for(env_shape)
        layers: list[Layer] = []
        for (weight, bias), (kernel, stride) in zip(self.cnn, NATURE_CNN):
            if weight.shape[2:] != (kernel, kernel):
                raise UserError(f"baseline.from: {self.path}: a {weight.shape[2]}x{weight.shape[3]} convolution where "
                                f"NatureCNN has {kernel}x{kernel}; a custom features extractor is not ported")
            layers.append(Layer(conv_kernel(weight), bias.astype(np.float32), "relu", stride))
        head = self.dense_layers()
        for i, (weight, bias) in enumerate(head):
            cnn_linear = bool(self.cnn) and i == 0
            activation = "linear" if i == len(head) - 1 else ("relu" if cnn_linear else self.activation_fn)
            layers.append(Layer(np.ascontiguousarray(weight.T, dtype=np.float32), bias.astype(np.float32), activation))
        net = PortedNet(layers, 1.0 / 255.0 if self.is_image and self.normalize_images else None,
                        f"baseline.from: {self.path}")
        first_dense = next(layer for layer in layers if not layer.is_conv)
        if self.cnn:
            h, w = conv_output_hw(self.obs_shape[1:], layers)
            first_dense.kernel = chw_rows_to_hwc(first_dense.kernel, layers[len(self.cnn) - 1].kernel.shape[3], h, w)
        elif transposed:
            first_dense.kernel = chw_rows_to_hwc(first_dense.kernel, *self.obs_shape)
        if net.input_scale is not None:
            net.notes.append("observations scaled by 1/255 in the network, as SB3 normalizes image observations")
        if transposed:
            net.notes.append("takes height x width x channel observations (SB3 saw them transposed)")
        if atari_note:
            net.notes.append(atari_note)
        if self.algorithm == "QR-DQN":
            net.notes.append(f"QR-DQN: the mean of its {self.n_quantiles} quantiles per action folded into the last layer "
                             "(sb3-contrib's greedy action is the argmax of that mean)")
        if self.spaces.pickled:
            net.notes.append("spaces read from the zip's pickled gym spaces (it has no readable fields), "
                             "through the restricted reader")
        self.transposed = transposed
        self.vecnormalize = read_vecnormalize(self.path)
        if self.vecnormalize is not None:
            normalization, clip = self.vecnormalize
            absorb_normalization(net, normalization)
            net.notes.append(f"VecNormalize observation statistics folded into the first layer (SB3 clips at "
                             f"+-{clip:g} standard deviations; the ported network does not)")
        return net

    def _atari_note(self, atari: str | None, env_shape: tuple[int, ...], played: AtariSettings | None) -> str | None:
        """Which preprocessing plays, for the notes; refused where it is not the one SB3 trained with."""
        if atari is None or not self.is_atari_cnn:
            return None
        zoo = zoo_atari(self.path)
        settings, source = zoo.settings, zoo.source
        if atari != "sb3":
            raise UserError(f"baseline.from: {self.path}: an SB3 Atari CnnPolicy, trained behind SB3's AtariWrapper; "
                            "set env.atari: {preprocessing: sb3} (compress-dqn compress picks it)")
        differ = settings.differing(played) if played is not None else []
        if differ:
            said = ", ".join(f"{key} {getattr(settings, key)} (the environment plays {getattr(played, key)})"
                             for key in differ)
            raise UserError(f"baseline.from: {self.path}: trained with AtariWrapper {said}; set "
                            + ", ".join(f"env.atari.{key}: {getattr(settings, key)}" for key in differ))
        k = atari_shape(self, settings)
        if env_shape != (*self.obs_shape[1:], k):
            raise UserError(f"baseline.from: {self.path}: SB3 stacked {k} frames of {self.obs_shape[1]}x{self.obs_shape[2]}, "
                            f"the environment gives {env_shape}; set env.frame_stack: {k} (and env.atari.screen_size)")
        return f"Atari preprocessing: {describe(settings, k)} ({source})."


def reference(policy: SB3Policy) -> Any:
    """SB3's own QNetwork (sb3-contrib's QuantileNetwork for QR-DQN, its Q-values the mean over quantiles, as its
    predict takes them) with torch.load(weights_only=True) weights: a function of env observations, for the
    port check (after policy.ported(), which decides the transpose and VecNormalize)."""
    import torch
    from stable_baselines3.common.torch_layers import FlattenExtractor, NatureCNN

    image = policy.is_image
    space = gym.spaces.Box(0 if image else -np.inf, 255 if image else np.inf, policy.obs_shape,
                           np.uint8 if image else np.dtype(policy.obs_dtype or "float32"))
    if policy.cnn:
        features_dim = int(policy.state["features_extractor.linear.0.weight"].shape[0])
        extractor = NatureCNN(space, features_dim, normalized_image=not policy.normalize_images)
    else:
        extractor, features_dim = FlattenExtractor(space), int(np.prod(policy.obs_shape))
    args = (space, gym.spaces.Discrete(policy.n_actions), extractor, features_dim)
    hidden = [int(w.shape[0]) for w, _ in policy.head[:-1]]
    activation = getattr(torch.nn, policy.torch_activation)
    if policy.algorithm == "QR-DQN":
        from sb3_contrib.qrdqn.policies import QuantileNetwork

        network = QuantileNetwork(*args, policy.n_quantiles, hidden, activation, policy.normalize_images)
    else:
        from stable_baselines3.dqn.policies import QNetwork

        network = QNetwork(*args, hidden, activation, policy.normalize_images)
    prefix = _NETS[policy.algorithm]
    state = torch.load(io.BytesIO(policy.pth), weights_only=True, map_location="cpu")
    network.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    network.eval()

    def q_values(obs: np.ndarray) -> np.ndarray:
        x = np.transpose(obs, (0, 3, 1, 2)) if policy.transposed else np.asarray(obs)
        if policy.vecnormalize is not None:
            normalization, clip = policy.vecnormalize
            x = np.clip((x - normalization.mean) / normalization.std, -clip, clip).astype(np.float32)
        with torch.no_grad():
            out = network(torch.as_tensor(np.ascontiguousarray(x)))
            return (out.mean(dim=1) if policy.algorithm == "QR-DQN" else out).numpy()

    return q_values


def read_vecnormalize(path: Path) -> tuple[Normalization, float] | None:
    """obs_rms (as mean and std = sqrt(var + epsilon)) and clip_obs of a vecnormalize.pkl beside the zip, or None.

    The RL Zoo saves it as <dir>/<env>/vecnormalize.pkl next to <dir>/<env>.zip; model.save() users
    keep it beside the zip. It pickles SB3 and gymnasium objects: they are read as inert records.
    """
    for candidate in (path.parent / "vecnormalize.pkl", path.parent / path.stem / "vecnormalize.pkl"):
        if candidate.is_file():
            break
    else:
        return None
    label = f"baseline.from: {candidate}"
    loaded = read_restricted_pickle(candidate.read_bytes(), label, ("stable_baselines3.", "gymnasium.", "numpy.random."))
    state = getattr(loaded, "state", None)
    if not isinstance(state, dict):
        raise UserError(f"{label}: not a VecNormalize save (VecNormalize.save(path)); remove it or save it again")
    if not state.get("norm_obs", True):
        return None
    rms = getattr(state.get("obs_rms"), "state", None)
    if not isinstance(rms, dict) or not isinstance(rms.get("mean"), np.ndarray):
        raise UserError(f"{label}: its obs_rms is not a single mean/var pair (a Dict observation space?); "
                        "only flat observations are ported")
    std = np.sqrt(np.asarray(rms["var"], dtype=np.float64) + float(state.get("epsilon", 1e-8)))
    return Normalization(np.asarray(rms["mean"], dtype=np.float64), std), float(state.get("clip_obs", 10.0))


class ZooAtari(NamedTuple):
    """What the RL Zoo's files beside a zip say about the environment an Atari agent was trained in."""

    settings: AtariSettings
    frame_stack: JsonValue
    """The Zoo's frame_stack as written (None: not written)."""
    env_kwargs: JsonValue
    """The Zoo's env_kwargs for gymnasium.make, as written (None: not written)."""
    source: str
    """Where the settings came from, for the notes."""


def zoo_atari(path: Path) -> ZooAtari:
    """The AtariWrapper settings, env_kwargs and frame_stack the RL Zoo's config.yml / args.yml beside
    the zip record (port/zoo_config.py); SB3's defaults for a bare zip.

    Refuses in one line an env_wrapper other than SB3's AtariWrapper, or settings this
    preprocessing does not reproduce (rewards left unclipped, SB3's own sticky actions)."""
    zoo = read_zoo(path)
    if not zoo.files:
        return ZooAtari(SB3_DEFAULTS, None, None, "a bare zip, taken as SB3's AtariWrapper with its defaults")
    settings = SB3_DEFAULTS
    for file, name, kwargs in zoo.wrappers:
        if name.rsplit(".", 1)[-1] != "AtariWrapper":
            raise UserError(f"baseline.from: {path}: {file.name} names env_wrapper {name}; only SB3's "
                            f"AtariWrapper ({ATARI_WRAPPER}) is reproduced, so it cannot be evaluated as trained")
        settings = _wrapper_settings(file, kwargs, settings)
    return ZooAtari(settings, zoo.frame_stack, zoo.env_kwargs, zoo.source)


def _wrapper_settings(file: Path, kwargs: dict[str, JsonValue], settings: AtariSettings) -> AtariSettings:
    """`settings` with the AtariWrapper arguments the Zoo file gives; refused where they are not reproduced."""
    unknown = sorted(set(kwargs) - set(AtariSettings._fields) - {"clip_reward", "action_repeat_probability"})
    if unknown:
        raise UserError(f"baseline.from: {file}: AtariWrapper argument {', '.join(unknown)} is not reproduced")
    if kwargs.get("clip_reward", True) is not True:
        raise UserError(f"baseline.from: {file}: AtariWrapper(clip_reward=False) is not reproduced "
                        "(its rollouts and fine-tunes clip rewards)")
    if float(kwargs.get("action_repeat_probability", 0.0) or 0.0) > 0.0:
        raise UserError(f"baseline.from: {file}: AtariWrapper's own sticky actions are not reproduced; "
                        "use the ALE's (env kwargs repeat_action_probability, an ALE/...-v5 id)")
    return settings._replace(**{key: kwargs[key] for key in AtariSettings._fields if key in kwargs})


def atari_shape(policy: SB3Policy, settings: AtariSettings) -> int:
    """The frame stack of an Atari CnnPolicy: its observations must be k x S x S (S the screen size)."""
    size = int(settings.screen_size)
    shape = policy.obs_shape
    if len(shape) != 3 or shape[0] < 2 or shape[1:] != (size, size):
        raise UserError(f"baseline.from: {policy.path}: SB3 saved observations of shape {shape}; SB3's AtariWrapper "
                        f"with a frame stack gives k x {size} x {size} (4 x 84 x 84 in the RL Zoo): its preprocessing "
                        "cannot be matched")
    return int(shape[0])


def atari_env(path: Path, data: bytes, env_id: str) -> EnvConfig | None:
    """The recipe's env section for an SB3 Atari CnnPolicy zip on an Atari id (SB3's preprocessing, its
    settings and frame stack), or None when the zip holds another policy or the id is no Atari game."""
    if not is_atari(env_id):
        return None
    policy = SB3Policy(path, data)
    if not policy.is_atari_cnn:
        return None
    zoo = zoo_atari(path)
    k = atari_shape(policy, zoo.settings)
    if zoo.frame_stack is not None and int(zoo.frame_stack) != k:
        raise UserError(f"baseline.from: {path}: the RL Zoo config says frame_stack {zoo.frame_stack}, the zip's "
                        f"observations stack {k} frames")
    kwargs = zoo.env_kwargs if isinstance(zoo.env_kwargs, dict) else {}
    return EnvConfig(id=env_id, frame_stack=k, kwargs=kwargs,
                     atari=AtariConfig(preprocessing="sb3", **zoo.settings._asdict()))
