"""An RLlib DQN (new API stack, torch) trained and saved with algo.save_to_path(), for compress-dqn to bring in.

ray[rllib] 2.60 pins gymnasium 1.2.2, so it runs in a venv of its own, never the project's (torch from
the CPU wheel, not a CUDA build):

    python3 -m venv /work/venvs/rllib
    /work/venvs/rllib/bin/pip install torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl 'ray[rllib]==2.60.*'
    /work/venvs/rllib/bin/python benchmarks/rllib_dqn.py --out runs/rllib --iterations 25
    /work/venvs/rllib/bin/python benchmarks/rllib_dqn.py --fixture tests/data/port/rllib

The first trains DQN on CartPole-v1 with dueling and double Q and fcnet_hiddens [64, 64] (RLlib's
default tanh) until --iterations, plays the greedy policy (the module's forward_inference) for 20
episodes, saves the checkpoint (out/checkpoint) and writes, beside it, out/q_values.npz: the Q-values
forward_inference acts on (compute_q_values' qf_preds) and its actions, on 512 states of those
episodes. Then, in the project's venv,

    compress-dqn compress runs/rllib/checkpoint --env CartPole-v1 --variants student-32x32-qat-int8

brings it in. The second writes the small fixtures tests/test_port_rllib.py reads: an untrained
dueling module ([8, 8], tanh) as a checkpoint directory cut to the files the reader opens, and a
plain-head one ([8], relu) as an RLModule directory, each with states, RLlib's Q-values and
actions, and the versions in expected.json. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

MODULE = Path("learner_group/learner/rl_module/default_policy")
CONNECTOR = Path("env_runner/env_to_module_connector")


def build(hiddens: list[int], activation: str, dueling: bool, seed: int):  # noqa: ANN201 - an RLlib Algorithm
    import ray
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (DQNConfig().environment("CartPole-v1").framework("torch").debugging(seed=seed)
              .env_runners(num_env_runners=0)
              .training(dueling=dueling, double_q=True, num_atoms=1)
              .rl_module(model_config=DefaultModelConfig(fcnet_hiddens=hiddens, fcnet_activation=activation)))
    return config.build_algo()


def q_values(module, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001 - an RLModule
    """The Q-values forward_inference acts on, and its actions."""
    import torch

    batch = {"obs": torch.as_tensor(states)}
    with torch.no_grad():
        q = module.compute_q_values(batch)["qf_preds"].numpy()
        actions = module.forward_inference(batch)["actions"].numpy()
    return q.astype(np.float32), actions


def play(module, episodes: int, seed: int) -> tuple[list[float], np.ndarray]:  # noqa: ANN001
    """Greedy returns of forward_inference on gymnasium's CartPole-v1, and the states visited."""
    import gymnasium as gym
    import torch

    env = gym.make("CartPole-v1")
    returns, states = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            states.append(obs)
            with torch.no_grad():
                action = int(module.forward_inference({"obs": torch.as_tensor(obs[None])})["actions"][0])
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return returns, np.asarray(states, dtype=np.float32)


def train(out: Path, iterations: int, seed: int) -> dict:
    algo = build([64, 64], "tanh", True, seed)
    start = time.perf_counter()
    history = []
    for i in range(iterations):
        result = algo.train()
        history.append(result.get("env_runners", {}).get("episode_return_mean"))
        print(f"iteration {i + 1}: episode_return_mean {history[-1]}", file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    checkpoint = algo.save_to_path(str((out / "checkpoint").absolute()))
    module = algo.get_module()
    returns, states = play(module, 20, 1000)
    pick = np.random.default_rng(seed).choice(len(states), size=min(512, len(states)), replace=False)
    q, actions = q_values(module, states[pick])
    np.savez(out / "q_values.npz", states=states[pick], q_values=q, actions=actions)
    algo.stop()
    return {"iterations": iterations, "train_seconds": round(seconds, 1), "last_train_return": history[-1],
            "mean_return_20": float(np.mean(returns)), "checkpoint": str(checkpoint)}


def _versions() -> dict:
    import ray
    import torch

    return {"ray": ray.__version__, "torch": torch.__version__}


def _states() -> np.ndarray:
    """64 states of random-action CartPole episodes."""
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    states = []
    while len(states) < 64:
        states.append(obs)
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(2)))
        if terminated or truncated:
            obs, _ = env.reset()
    return np.asarray(states, dtype=np.float32)


def _expected(module, out: Path, note: str) -> None:  # noqa: ANN001
    states = _states()
    q, actions = q_values(module, states)
    (out / "expected.json").write_text(json.dumps({"versions": _versions(), "network": note, "states": states.tolist(),
                                                   "q_values": q.tolist(), "actions": actions.tolist()}))


def fixture(out: Path) -> dict:
    """Two untrained modules: a cut-down dueling checkpoint and a plain-head RLModule directory."""
    import tempfile

    made = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(20):  # the first seed whose untrained module takes both actions on the states
            algo = build([8, 8], "tanh", True, seed)
            if len(set(q_values(algo.get_module(), _states())[1].tolist())) == 2:
                break
            algo.stop()
        full = Path(algo.save_to_path(str(Path(tmp) / "dueling")))
        target = out / "dueling_checkpoint"
        shutil.rmtree(target, ignore_errors=True)
        for rel in ["rllib_checkpoint.json", MODULE / "module_state.pkl", MODULE / "class_and_ctor_args.pkl",
                    MODULE / "metadata.json", CONNECTOR / "class_and_ctor_args.pkl", CONNECTOR / "metadata.json"]:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(full / rel, target / rel)
        _expected(algo.get_module(), target, f"dueling, fcnet_hiddens [8, 8], tanh, untrained (seed {seed})")
        made["dueling"] = str(target)
        algo.stop()
        algo = build([8], "relu", False, 1)
        full = Path(algo.save_to_path(str(Path(tmp) / "plain")))
        target = out / "plain_module"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in ("module_state.pkl", "class_and_ctor_args.pkl", "metadata.json"):
            shutil.copy(full / MODULE / name, target / name)
        _expected(algo.get_module(), target, "plain head, fcnet_hiddens [8], relu, untrained (seed 1)")
        made["plain"] = str(target)
        algo.stop()
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/rllib"))
    parser.add_argument("--iterations", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", type=Path, help="write the test fixtures here instead of training")
    args = parser.parse_args()
    if args.fixture is not None:
        print(json.dumps(fixture(args.fixture)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    print(json.dumps(train(args.out, args.iterations, args.seed)))


if __name__ == "__main__":
    main()
