"""A compress-dqn run directory as a brought baseline: its trained network and its replay buffer.

`compress-dqn compress runs/cartpole` and `search runs/cartpole` (or `baseline.from: runs/cartpole`)
start from the run's finished baseline instead of training it again: the network is rebuilt from
the run's own recipe and weights.npz (no pickle, nothing executed), and the data to compress with
is the replay buffer the baseline trained on. The run itself loads its baseline the same way
(`baseline_network`), so a run and a run that starts from it play the same network.
"""

from __future__ import annotations

from pathlib import Path

from compress_dqn._tf import tf_keras
from compress_dqn.envs.environment import EnvInfo
from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import SourceData
from compress_dqn.fileio import load_arrays
from compress_dqn.port.keras_file import load_keras
from compress_dqn.recipe.safe_yaml import read_yaml
from compress_dqn.recipe.schema import EnvConfig, Recipe, recipe_from_data
from compress_dqn.replay.buffer import ReplayBuffer, load_replay
from compress_dqn.rl.networks import network_for
from compress_dqn.store.layout import RunLayout


def baseline_network(layout: RunLayout, recipe: Recipe, info: EnvInfo) -> tf_keras.Model:
    """A run's baseline Q-network with its trained weights: a brought one from the Keras file the run
    kept of it, a trained one rebuilt from the recipe."""
    model = load_keras(layout.keras_model, info) if recipe.baseline is not None else network_for(info, recipe.train)
    model.set_weights(load_arrays(layout.weights))
    return model


def _finished_run(path: str | Path) -> tuple[RunLayout, Recipe]:
    """The single-seed run `path` names, with a trained baseline, and its recipe (UserError otherwise)."""
    layout = RunLayout.find(path)
    if layout is None:
        raise UserError(f"{path}: not a compress-dqn run directory (no recipe.yaml and stages.json); "
                        "pass a run's directory or its baseline/ folder")
    recipe = recipe_from_data(read_yaml(layout.recipe), str(layout.recipe))
    if recipe.seeds:
        raise UserError(f"{layout.root}: a run of several seeds; pass one seed's directory, e.g. "
                        f"{layout.seed(recipe.seeds[0]).root}")
    if not layout.trained:
        raise UserError(f"{layout.root}: its baseline has not finished training; run it to the end first "
                        f"(compress-dqn run {layout.recipe} --out {layout.root})")
    return layout, recipe


def run_env(path: str | Path, env_id: str) -> EnvConfig | None:
    """The environment settings (kwargs, preprocessing) of the run `path` names; None where `path`
    is no run. A run of another environment than `env_id` is refused."""
    if RunLayout.find(path) is None:
        return None
    layout, recipe = _finished_run(path)
    if recipe.env.id != env_id:
        raise UserError(f"{layout.root}: its baseline plays {recipe.env.id}, not {env_id}; pass --env {recipe.env.id}")
    return recipe.env


def load_run_network(path: str | Path, info: EnvInfo) -> tf_keras.Model:
    """The baseline Q-network of the run `path` names, as the run itself loads it."""
    layout, recipe = _finished_run(path)
    if recipe.env.id != info.env_id or recipe.env.frame_stack != info.frame_stack:
        raise UserError(f"{layout.root}: its baseline plays {recipe.env.id} (frame_stack {recipe.env.frame_stack}), "
                        f"not {info.env_id} (frame_stack {info.frame_stack}); pass --env {recipe.env.id}")
    return baseline_network(layout, recipe, info)


def run_replay(path: str | Path, info: EnvInfo) -> tuple[ReplayBuffer, SourceData]:
    """The replay buffer the run's baseline trained on (or was compressed with), and its record."""
    layout, _ = _finished_run(path)
    replay = load_replay(layout.replay, info.obs_shape, info.obs_dtype, info.n_actions, frame_stack=info.frame_stack)
    return replay, SourceData(kind="run replay", path=str(layout.replay), transitions=replay.num_transitions)
