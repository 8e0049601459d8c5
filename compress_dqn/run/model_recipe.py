"""The one-off recipe `compress` and `search` make for a Q-network trained elsewhere: loading the model
(to learn its layers) and reading its environment happen here, below the command line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from compress_dqn.envs.environment import is_image, probe_env
from compress_dqn.errors import UserError
from compress_dqn.port.baseline import load_model
from compress_dqn.port.load import file_kind
from compress_dqn.port.run_dir import run_env
from compress_dqn.port.sb3 import atari_env
from compress_dqn.port.zoo_config import zoo_env
from compress_dqn.port.tensor_pickle import read_file
from compress_dqn.recipe.schema import EnvConfig, env_from_data
from compress_dqn.rl.networks import weight_layers


class ModelRecipe(BaseModel):
    """A recipe as data, before the command adds its variants or search; the layers to keep dense
    (like the shipped recipes: the small input and output layers); whether observations are flat (any
    observation that is not an image, whatever its shape: the network flattens it)."""

    data: dict[str, Any]
    keep_dense: list[str]
    flat: bool


def network_shape(weighted: list[Any]) -> dict[str, Any]:
    """The brought network's shape as a recipe's train.net_arch and train.conv, so that the search's
    size estimates are of this network (a 256x256 MLP left at the default 64x64 put its 90%-pruned
    int8 rung at 614 B where it gzips to ~20 KB, so rungs that could not win were played, not
    skipped). Conv layers a recipe cannot describe (non-square kernels or strides) leave conv out."""
    dense = [int(layer.units) for layer in weighted if not hasattr(layer, "filters")][:-1]
    convs = [layer for layer in weighted if hasattr(layer, "filters")]
    shape: dict[str, Any] = {"net_arch": dense}
    if all(layer.kernel_size[0] == layer.kernel_size[1] and layer.strides[0] == layer.strides[1] and
           layer.padding == "valid" for layer in convs):
        shape["conv"] = [{"filters": int(c.filters), "kernel": int(c.kernel_size[0]), "stride": int(c.strides[0])}
                         for c in convs]
    return shape


def model_env(model: Path, env_id: str, frame_stack: int, overrides: tuple[str, ...] = ()) -> EnvConfig:
    """The environment `model` plays: a run's own settings; an SB3 agent's from the RL Zoo files beside
    it (an Atari agent's AtariWrapper, any agent's env_kwargs, env_wrapper and frame_stack); else the id
    and --frame-stack. The command line's env.* overrides come last (they win), before anything is probed."""
    env = run_env(model, env_id)  # a run's own settings, kwargs too
    if env is None and model.is_file() and file_kind(model) == "sb3":
        data = read_file(model)
        env = atari_env(model, data, env_id) or zoo_env(model, env_id, frame_stack)
    env = env or EnvConfig(id=env_id, frame_stack=frame_stack)
    return env_from_data(env.model_dump(mode="json", exclude_none=True), overrides)


def recipe_for_model(model: Path, env_id: str, transitions: Path | None, rollout_steps: int, epsilon: float,
                     frame_stack: int, episodes: int, max_episodes: int, seed: int,
                     overrides: tuple[str, ...] = ()) -> ModelRecipe:
    """The recipe for compressing `model` on `env_id`, its environment shaped by the env.* `overrides`.

    Its verdicts use sequential looks as the shipped recipes do: identical episodes decide "within"
    only from ~400 on, so a plain 100-episode evaluation would leave the best variants undecided."""
    env = model_env(model, env_id, frame_stack, overrides)
    info = probe_env(env)
    weighted = weight_layers(load_model(model, info))
    layers = [layer.name for layer in weighted]
    keep_dense = [layers[-1]] + ([layers[0]] if len(layers) > 2 else [])
    baseline: dict[str, Any] = {"from": str(model.absolute())}
    if transitions is not None:
        if not transitions.is_file():  # before the run directory exists: a typo must not block the rerun
            raise UserError(f"--transitions: {transitions}: no such file; pass an .npz of transitions")
        baseline["transitions"] = str(transitions.absolute())
    else:
        baseline["rollout"] = {"steps": rollout_steps, "epsilon": epsilon}
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", model.stem if model.is_file() else model.absolute().name).lstrip(".-_")
    name = name or "model"
    if model.is_dir():  # a run directory (or SavedModel): runs/NAME could be the source itself
        name = f"{name}-compressed"
    data = {"name": name, "seed": seed, "env": env.model_dump(mode="json", exclude_none=True), "baseline": baseline,
            "eval": {"episodes": episodes, "seed": 0, "max_episodes": max(max_episodes, episodes)},
            "train": network_shape(weighted)}
    return ModelRecipe(data=data, keep_dense=keep_dense, flat=not is_image(info))
