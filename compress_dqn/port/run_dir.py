"""A compress-dqn run directory as a brought baseline: its trained network and its replay buffer.

`compress-dqn compress runs/cartpole` and `search runs/cartpole` (or `baseline.from: runs/cartpole`)
start from the run's finished baseline instead of training it again: the network is rebuilt from
the run's own recipe and weights.npz (no pickle, nothing executed), and the data to compress with
is the replay buffer the baseline trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from compress_dqn.errors import UserError
from compress_dqn.fileio import load_arrays
from compress_dqn.recipe.safe_yaml import read_yaml
from compress_dqn.recipe.schema import recipe_from_data
from compress_dqn.replay.buffer import load_replay


def run_root(path: str | Path) -> Path | None:
    """The run directory that `path` names (the run itself or its baseline/ folder), or None.

    A run holds recipe.yaml and stages.json; one of several seeds (or a search) holds recipe.yaml
    and seed-N/ folders, and is named so that _recipe can say which folder to pass instead."""
    path = Path(path)
    root = path.parent if path.name == "baseline" else path
    if not path.is_dir() or not (root / "recipe.yaml").is_file():
        return None
    if (root / "stages.json").is_file() or any(root.glob("seed-*/stages.json")):
        return root
    return None


def _recipe(root: Path) -> Any:
    recipe = recipe_from_data(read_yaml(root / "recipe.yaml"), str(root / "recipe.yaml"))
    if recipe.seeds:
        raise UserError(f"{root}: a run of several seeds; pass one seed's directory, e.g. {root / f'seed-{recipe.seeds[0]}'}")
    if not (root / "baseline" / "weights.npz").is_file() or not (root / "baseline" / "replay.npz").is_file():
        raise UserError(f"{root}: its baseline has not finished training; run it to the end first "
                        f"(compress-dqn run {root / 'recipe.yaml'} --out {root})")
    return recipe


def run_env(path: str | Path, env_id: str) -> dict[str, Any] | None:
    """The environment settings (kwargs, preprocessing) of the run `path` names, as recipe data; None
    where `path` is no run. A run of another environment than `env_id` is refused."""
    root = run_root(path)
    if root is None:
        return None
    env = _recipe(root).env
    if env.id != env_id:
        raise UserError(f"{root}: its baseline plays {env.id}, not {env_id}; pass --env {env.id}")
    return env.model_dump(mode="json", exclude_none=True)


def load_run_network(path: str | Path, info: Any) -> Any:
    """The run's baseline Q-network (tf_keras), rebuilt as the run itself loads it, with its weights."""

    root = run_root(path)
    recipe = _recipe(root)
    if recipe.env.id != info.env_id or recipe.env.frame_stack != info.frame_stack:
        raise UserError(f"{root}: its baseline plays {recipe.env.id} (frame_stack {recipe.env.frame_stack}), not "
                        f"{info.env_id} (frame_stack {info.frame_stack}); pass --env {recipe.env.id}")
    if recipe.baseline is not None:  # itself a brought baseline: the run kept it as a Keras file
        from compress_dqn.port.keras_file import load_keras

        model = load_keras(root / "baseline" / "model.keras", info)
    else:
        from compress_dqn.rl.networks import network_for

        model = network_for(info, recipe.train)
    model.set_weights(load_arrays(root / "baseline" / "weights.npz"))
    return model


def run_replay(path: str | Path, info: Any) -> tuple[Any, dict[str, Any]]:
    """The replay buffer the run's baseline trained on (or was compressed with), and its record."""

    root = run_root(path)
    _recipe(root)
    replay = load_replay(root / "baseline" / "replay.npz", info.obs_shape, info.obs_dtype, info.n_actions,
                                    frame_stack=info.frame_stack)
    return replay, {"kind": "run replay", "path": str(root / "baseline" / "replay.npz"),
                    "transitions": replay.num_transitions}
