#!/usr/bin/env python3
"""Make the port fixtures with the real libraries (Stable-Baselines3, PyTorch, ONNX): small files the importer tests read.

Run from the repository root with the sb3 and onnx extras installed:
    python tests/data/make_port_fixtures.py
It rewrites tests/data/port/. The CNN fixtures are too large to commit (NatureCNN alone is ~80k
weights), so the tests call `sb3_cnn` and `cleanrl_cnn` to make them in a temporary directory.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "port"


def sb3_mlp(path: Path, net_arch: list[int], steps: int, activation: str = "ReLU", vecnormalize: bool = False) -> None:
    """An SB3 DQN on CartPole-v1, briefly trained, saved with model.save() (and VecNormalize.save())."""
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    torch.manual_seed(0)
    env = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    if vecnormalize:
        env = VecNormalize(env, norm_obs=True, norm_reward=True)
    kwargs = {"net_arch": net_arch}
    if activation != "ReLU":
        kwargs["activation_fn"] = getattr(torch.nn, activation)
    model = DQN("MlpPolicy", env, policy_kwargs=kwargs, buffer_size=2_000, learning_starts=200, train_freq=4,
                target_update_interval=100, seed=0, device="cpu")
    if steps:
        model.learn(steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    if vecnormalize:
        env.save(str(path.parent / "vecnormalize.pkl"))


class _Frames:
    """A gymnasium env of random uint8 frames (height x width x channels): only its space matters."""

    def __new__(cls, shape: tuple[int, ...], n_actions: int):
        import gymnasium as gym

        class Frames(gym.Env):
            observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
            action_space = gym.spaces.Discrete(n_actions)

            def reset(self, *, seed=None, options=None):
                super().reset(seed=seed)
                return self.observation_space.sample(), {}

            def step(self, action):
                return self.observation_space.sample(), 0.0, False, False, {}

        return Frames()


def sb3_cnn(path: Path, shape: tuple[int, ...] = (36, 36, 2), n_actions: int = 3, features_dim: int = 16) -> None:
    """An untrained SB3 CnnPolicy (NatureCNN) DQN on channel-last uint8 frames: SB3 transposes them."""
    import torch
    from stable_baselines3 import DQN

    torch.manual_seed(0)
    model = DQN("CnnPolicy", _Frames(shape, n_actions), buffer_size=10, learning_starts=10, seed=0, device="cpu",
                policy_kwargs={"features_extractor_kwargs": {"features_dim": features_dim}})
    model.save(path)


def qrdqn(path: Path, policy: str = "MlpPolicy", net_arch: list[int] | None = None, n_quantiles: int = 5,
          shape: tuple[int, ...] = (36, 36, 2), n_actions: int = 3, features_dim: int = 16) -> None:
    """An untrained sb3-contrib QR-DQN: MlpPolicy on CartPole-v1, or CnnPolicy on channel-last uint8 frames."""
    import gymnasium as gym
    import torch
    from sb3_contrib import QRDQN

    torch.manual_seed(0)
    kwargs: dict = {"n_quantiles": n_quantiles, "net_arch": net_arch or [16, 16]}
    if policy == "CnnPolicy":
        env, kwargs["features_extractor_kwargs"] = _Frames(shape, n_actions), {"features_dim": features_dim}
    else:
        env = gym.make("CartPole-v1")
    model = QRDQN(policy, env, buffer_size=10, learning_starts=10, seed=0, device="cpu", policy_kwargs=kwargs)
    model.save(path)


class _FakeGym:
    """gym's space modules for as long as a space is pickled, so the pickle names gym.spaces.box.Box as
    old gym's did (gym itself is not installed); reading them back never imports them."""

    def __enter__(self) -> dict[str, type]:
        import types

        self.names = ["gym", "gym.spaces", "gym.spaces.box", "gym.spaces.discrete"]
        classes = {}
        for name in self.names:
            sys.modules[name] = types.ModuleType(name)
        for module, cls in (("gym.spaces.box", "Box"), ("gym.spaces.discrete", "Discrete")):
            classes[cls] = type(cls, (), {"__module__": module})
            setattr(sys.modules[module], cls, classes[cls])
        return classes

    def __exit__(self, *exc: object) -> None:
        for name in self.names:
            sys.modules.pop(name, None)


def gym_space_pickle(space: object) -> str:
    """A gymnasium Box or Discrete as SB3 1.0's cloudpickle of a gym space: base64 of a pickle naming
    gym.spaces.box.Box (or .discrete.Discrete) with its fields, and old gym's RandomState."""
    import base64
    import pickle

    with _FakeGym() as classes:
        if hasattr(space, "n"):
            obj = classes["Discrete"]()
            obj.__dict__.update(n=int(space.n), shape=(), dtype=np.dtype(np.int64), np_random=np.random.RandomState(0))
        else:
            obj = classes["Box"]()
            obj.__dict__.update(dtype=space.dtype, shape=tuple(space.shape), low=space.low, high=space.high,
                                bounded_below=space.bounded_below, bounded_above=space.bounded_above, np_random=None)
        return base64.b64encode(pickle.dumps(obj, protocol=4)).decode()


def as_layout(path: Path, out: Path, layout: str) -> None:
    """Rewrite an SB3 2.x zip's `data` as an older SB3 wrote it: "1.x" (gym, readable `shape`) or "1.0"
    (no readable fields, only the pickled gym spaces, as issue 57 reported of SB3 1.0 zips); the weights stay the same."""
    import json
    import zipfile

    import gymnasium as gym

    with zipfile.ZipFile(path) as original:
        entries = {name: original.read(name) for name in original.namelist()}
    data = json.loads(entries["data"])
    for key in ("observation_space", "action_space"):
        entry = data[key]
        entry[":type:"] = entry[":type:"].replace("gymnasium.", "gym.")
        if layout == "1.x":
            entry["shape"] = entry.pop("_shape")
        else:
            if key == "observation_space":  # bounds: SB3's image bounds, else unbounded (the port reads only those)
                shape = tuple(entry["_shape"])
                dtype = np.dtype(entry["dtype"])
                image = dtype == np.uint8
                space = gym.spaces.Box(0 if image else -np.inf, 255 if image else np.inf, shape, dtype)
            else:
                space = gym.spaces.Discrete(int(entry["n"]))
            data[key] = {":type:": entry[":type:"], ":serialized:": gym_space_pickle(space)}
    entries["data"] = json.dumps(data).encode()
    entries["_stable_baselines3_version"] = b"1.0rc0" if layout == "1.0" else b"1.8.0"
    with zipfile.ZipFile(out, "w") as archive:
        for name, content in entries.items():
            archive.writestr(name, content)


def cleanrl_mlp(path: Path, obs_dim: int = 4, n_actions: int = 2) -> None:
    """CleanRL's dqn.py QNetwork (Linear 120, 84), random weights, torch.save(state_dict)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    network = nn.Sequential(nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions))
    torch.save(network.state_dict(), path)
    _prefixed(path, "network.")


def cleanrl_cnn(path: Path, channels: int = 4, n_actions: int = 4, hidden: int = 512) -> None:
    """CleanRL's dqn_atari.py QNetwork (Nature convolutions on x / 255), random weights."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    network = nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, hidden), nn.ReLU(),
        nn.Linear(hidden, n_actions))
    torch.save(network.state_dict(), path)
    _prefixed(path, "network.")


def _prefixed(path: Path, prefix: str) -> None:
    """CleanRL's QNetwork keeps its Sequential as `self.network`: keys network.0.weight, ..."""
    import torch

    state = torch.load(path, weights_only=True)
    torch.save({prefix + key: value for key, value in state.items()}, path)


def sb3_onnx(zip_path: Path, path: Path) -> None:
    """SB3's q_net exported to ONNX the way SB3's documentation shows (torch.onnx.export)."""
    import torch
    from stable_baselines3 import DQN

    model = DQN.load(zip_path, device="cpu")  # our own fixture: its pickles are trusted here
    q_net = model.policy.q_net.eval()
    dummy = torch.zeros((1, *model.observation_space.shape), dtype=torch.float32)
    torch.onnx.export(q_net, dummy, str(path), input_names=["obs"], output_names=["q_values"],
                      dynamic_axes={"obs": {0: "batch"}, "q_values": {0: "batch"}}, dynamo=False)


def main() -> None:
    HERE.mkdir(parents=True, exist_ok=True)
    sb3_mlp(HERE / "sb3_cartpole.zip", [32, 32], steps=3_000)
    sb3_mlp(HERE / "sb3_cartpole_tanh.zip", [16], steps=0, activation="Tanh")
    sb3_mlp(HERE / "vecnorm" / "sb3_cartpole_vecnorm.zip", [16, 16], steps=1_000, vecnormalize=True)
    cleanrl_mlp(HERE / "cleanrl_cartpole.cleanrl_model")
    sb3_onnx(HERE / "sb3_cartpole.zip", HERE / "sb3_cartpole.onnx")
    for file in sorted(HERE.rglob("*")):
        if file.is_file():
            print(f"{file.relative_to(HERE.parent)}: {file.stat().st_size:,} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
