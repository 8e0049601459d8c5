"""Bring your own baseline: a Q-network trained elsewhere, and data to compress it with.

Most users arrive with a trained DQN. The rest of the pipeline needs two things from a baseline:
a tf_keras model (observations -> one Q-value per action) and a replay buffer of states and
transitions for calibration, distillation and TD fine-tuning. Here the model comes from a file,
checked against the environment, and the buffer from playing it (epsilon-greedy) or from an .npz
of transitions, checked for shapes and dtypes.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.port.load import file_kind, port_model
from compress_dqn.replay.buffer import ReplayBuffer

TRANSITION_KEYS = ("observations", "actions", "rewards", "next_observations", "terminated", "truncated")


def _shape(value: Any) -> tuple:
    return tuple(None if d is None else int(d) for d in value)


def load_model(path: str | Path, info: Any) -> Any:
    """A tf_keras model from .keras, .h5 or a Keras SavedModel directory, or ported from a
    Stable-Baselines3 zip, a PyTorch state dict or an ONNX file; checked against the env.

    Safe mode is forced on for every format: tf_keras honours `safe_mode` only for zip .keras
    files, and an .h5 file (or HDF5 bytes named .keras) with a Lambda layer would otherwise run the
    Python code stored in it while loading.
    """
    from compress_dqn._tf import quiet_stderr, tf_keras  # first: it sets TensorFlow's environment before the import
    from tf_keras.src.saving.serialization_lib import SafeModeScope

    path = Path(path)
    if not path.exists():
        raise UserError(f"baseline.from: {path}: no such file or directory; check the path")
    kind = file_kind(path)
    if kind == "run":
        from compress_dqn.port.run_dir import load_run_network

        return load_run_network(path, info)
    if kind != "keras":
        return port_model(path, info, kind)
    if path.is_file() and path.suffix not in (".keras", ".h5"):
        raise UserError(f"baseline.from: {path}: expected a .keras or .h5 file, a Keras SavedModel directory, "
                        "a Stable-Baselines3 DQN .zip, a PyTorch state dict (.pt, .pth, .cleanrl_model) "
                        "or an .onnx file")
    if path.is_file() and path.suffix == ".keras" and not zipfile.is_zipfile(path):
        raise UserError(f"baseline.from: {path}: not a zip-format .keras file (a damaged file, or HDF5 bytes "
                        "under a .keras name); save it again with model.save('q.keras'), or name an HDF5 file .h5")
    try:
        with quiet_stderr(), SafeModeScope(True):
            model = tf_keras.models.load_model(str(path), compile=False)
    except Exception as exc:  # tf_keras raises many kinds for bad files; all mean "cannot load"
        if "Lambda layer" in str(exc):
            raise UserError(f"baseline.from: {path}: it has a Lambda layer, which would run Python code stored in "
                            "the file; rebuild the network from standard layers (Dense, Conv2D, ...)") from None
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        hint = ("; a SavedModel must be a Keras one (model.save(dir)): a bare tf.Module has no layers to compress"
                if path.is_dir() else "")
        raise UserError(f"baseline.from: {path}: tf_keras cannot load it ({reason}){hint}") from None
    if not isinstance(model, tf_keras.Model):
        raise UserError(f"baseline.from: {path}: loaded a {type(model).__name__}, not a tf_keras model")
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise UserError(f"baseline.from: {path}: the model has {len(model.inputs)} inputs and {len(model.outputs)} "
                        "outputs; a Q-network maps one observation input to one Q-value output")
    in_shape, out_shape = _shape(model.input_shape[1:]), _shape(model.output_shape[1:])
    problems = []
    if in_shape != tuple(info.obs_shape):
        problems.append(f"its input shape is {in_shape} but {info.env_id} observations are {tuple(info.obs_shape)}")
    if out_shape != (info.n_actions,):
        problems.append(f"its output shape is {out_shape} but {info.env_id} has {info.n_actions} actions "
                        f"(expected ({info.n_actions},): one Q-value per action)")
    if problems:
        raise UserError(f"baseline.from: {path}: " + "; ".join(problems))
    return model


def file_digest(path: str | Path) -> str:
    """SHA-256 of a model file or of a SavedModel directory's files, for the report."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(file.relative_to(path.parent if path.is_file() else path).as_posix().encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


def rollout(model: Any, env_cfg: Any, info: Any, steps: int, epsilon: float, capacity: int, seed: int) -> tuple[ReplayBuffer, dict[str, Any]]:
    """Play the model epsilon-greedily for `steps` env steps into a fresh replay buffer."""
    from compress_dqn.rl.envs import make_env_from, seed_env
    from compress_dqn.rl.networks import make_actor

    replay = ReplayBuffer(max(2, min(capacity, steps + steps // 2 + 2)), info.obs_shape, info.obs_dtype,
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
    summary = {"kind": "rollout", "steps": steps, "epsilon": epsilon, "episodes": len(returns),
               "mean_episode_return": float(np.mean(returns)) if returns else None}
    return replay, summary


def load_transitions(path: str | Path, info: Any, capacity: int, seed: int) -> tuple[ReplayBuffer, dict[str, Any]]:
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
    # Unrelated transitions take up to frame_stack + 1 rows each (a stack's history, then the next frame).
    rows = max(2, min(capacity, (info.frame_stack + 1) * n))
    replay = ReplayBuffer(rows, info.obs_shape, info.obs_dtype, info.n_actions, seed, frame_stack=info.frame_stack)
    for i in range(n):
        try:
            replay.add(arrays["observations"][i], int(actions[i]), float(arrays["rewards"][i]),
                       arrays["next_observations"][i], bool(arrays["terminated"][i]), bool(arrays["truncated"][i]))
        except ValueError as exc:
            raise UserError(f"baseline.transitions: {path}: transition {i}: {exc}") from None
    return replay, {"kind": "transitions", "path": str(path), "transitions": n}
