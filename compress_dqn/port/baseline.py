"""Bring your own baseline: a Q-network trained elsewhere, and data to compress it with.

Most users arrive with a trained DQN. The rest of the pipeline needs two things from a baseline:
a tf_keras model (observations -> one Q-value per action) and a replay buffer of states and
transitions for calibration, distillation and TD fine-tuning. Here the model comes from a file,
checked against the environment, and the buffer from playing it (epsilon-greedy) or from an .npz
of transitions, checked for shapes and dtypes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn._tf import tf_keras
from compress_dqn.envs.environment import EnvInfo, make_env_from, seed_env
from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import SourceData
from compress_dqn.port.brought_data import rollout_rows, transition_rows
from compress_dqn.port.keras_file import load_keras
from compress_dqn.port.load import file_kind, port_model
from compress_dqn.port.run_dir import load_run_network
from compress_dqn.recipe.schema import EnvConfig
from compress_dqn.replay.buffer import ReplayBuffer
from compress_dqn.rl.networks import make_actor
from compress_dqn.store.layout import RunLayout

TRANSITION_KEYS = ("observations", "actions", "rewards", "next_observations", "terminated", "truncated")


def load_model(path: str | Path, info: Any) -> Any:
    """A tf_keras Q-network from a Keras file or SavedModel directory, a finished compress-dqn run,
    or ported from a Stable-Baselines3 zip, a PyTorch state dict or an ONNX file; checked against the env."""

    path = Path(path)
    if not path.exists():
        raise UserError(f"baseline.from: {path}: no such file or directory; check the path")
    if RunLayout.find(path) is not None:
        return load_run_network(path, info)
    kind = file_kind(path)
    if kind != "keras":
        return port_model(path, info, kind)
    return load_keras(path, info)


def file_digest(path: str | Path) -> str:
    """SHA-256 of a model file or of a SavedModel directory's files, for the report."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(file.relative_to(path.parent if path.is_file() else path).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def rollout(model: tf_keras.Model, env_cfg: EnvConfig, info: EnvInfo, steps: int, epsilon: float, capacity: int,
            seed: int) -> tuple[ReplayBuffer, SourceData]:
    """Play the model epsilon-greedily for `steps` env steps into a fresh replay buffer."""
    replay = ReplayBuffer(rollout_rows(capacity, steps), info.obs_shape, info.obs_dtype,
                          info.n_actions, seed, frame_stack=info.frame_stack)
    actor = make_actor(model)
    rng = np.random.default_rng(seed)
    env = make_env_from(env_cfg)
    returns, total = [], 0.0
    try:
        obs = seed_env(env, seed)
        for _ in range(steps):
            action = int(rng.integers(info.n_actions)) if rng.random() < epsilon else actor.act(obs)
            next_obs, reward, terminated, truncated, _ = env.step(action)
            replay.add(obs, action, float(reward), next_obs, bool(terminated), bool(truncated))
            total += float(reward)
            obs = next_obs
            if terminated or truncated:
                returns.append(total)
                total = 0.0
                obs, _ = env.reset()
    finally:
        env.close()
    return replay, SourceData(kind="rollout", steps=steps, epsilon=epsilon, episodes=len(returns),
                               mean_episode_return=float(np.mean(returns)) if returns else None)


def load_transitions(path: str | Path, info: EnvInfo, capacity: int, seed: int) -> tuple[ReplayBuffer, SourceData]:
    """Transitions from an .npz (no pickle), each array checked, into a fresh replay buffer."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except FileNotFoundError:
        raise UserError(f"baseline.transitions: {path}: no such file; check the path") from None
    except (ValueError, OSError) as exc:
        raise UserError(f"baseline.transitions: {path}: not a readable .npz without pickles ({str(exc)[:120]})") from None
    missing = [key for key in TRANSITION_KEYS if key not in arrays]
    if missing:
        raise UserError(f"baseline.transitions: {path}: missing arrays {', '.join(missing)} "
                        f"(needs {', '.join(TRANSITION_KEYS)})")
    n = len(arrays["actions"])
    obs_shape = (n, *info.obs_shape)
    for key in ("observations", "next_observations"):
        if arrays[key].shape != obs_shape:
            raise UserError(f"baseline.transitions: {path}: {key} has shape {arrays[key].shape}, expected {obs_shape} "
                            f"({n} transitions of {info.env_id} observations)")
        if arrays[key].dtype.kind not in "fiub":
            raise UserError(f"baseline.transitions: {path}: {key} has dtype {arrays[key].dtype}; expected numbers")
        if arrays[key].dtype.kind == "f" and not np.isfinite(arrays[key]).all():
            row = int(np.argwhere(~np.isfinite(arrays[key]))[0][0])
            raise UserError(f"baseline.transitions: {path}: {key} holds NaN or infinite values (first at row {row}); "
                            "drop or fix those transitions")
    for key in ("actions", "rewards", "terminated", "truncated"):
        if arrays[key].shape != (n,):
            raise UserError(f"baseline.transitions: {path}: {key} has shape {arrays[key].shape}, expected ({n},)")
    actions = arrays["actions"]
    if actions.dtype.kind not in "iu":
        raise UserError(f"baseline.transitions: {path}: actions have dtype {actions.dtype}; expected integers")
    if n and (actions.min() < 0 or actions.max() >= info.n_actions):
        raise UserError(f"baseline.transitions: {path}: actions range over [{actions.min()}, {actions.max()}] "
                        f"but {info.env_id} has actions 0..{info.n_actions - 1}")
    if arrays["rewards"].dtype.kind not in "fiu" or not np.isfinite(arrays["rewards"].astype(np.float64)).all():
        raise UserError(f"baseline.transitions: {path}: rewards must be finite numbers")
    for key in ("terminated", "truncated"):
        if arrays[key].dtype != np.bool_ and not np.isin(arrays[key], (0, 1)).all():
            raise UserError(f"baseline.transitions: {path}: {key} must be booleans (or 0/1)")
    if n < 2:
        raise UserError(f"baseline.transitions: {path}: holds {n} transitions; at least 2 are needed")
    replay = ReplayBuffer(transition_rows(capacity, n, info.frame_stack), info.obs_shape, info.obs_dtype,
                          info.n_actions, seed, frame_stack=info.frame_stack)
    for i in range(n):
        try:
            replay.add(arrays["observations"][i], int(actions[i]), float(arrays["rewards"][i]),
                       arrays["next_observations"][i], bool(arrays["terminated"][i]), bool(arrays["truncated"][i]))
        except ValueError as exc:
            raise UserError(f"baseline.transitions: {path}: transition {i}: {exc}") from None
    return replay, SourceData(kind="transitions", path=str(path), transitions=n)
