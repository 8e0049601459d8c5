"""The recipe's env block: which gymnasium environment, its time limit, frame stack and Atari preprocessing."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, JsonValue, model_validator

from compress_dqn.recipe.values import Count, PositiveCount, StrictModel, count_from


_ATARI_ID = re.compile(r"ALE/.+|[A-Za-z]\w*NoFrameskip-v4")


_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def split_env_id(env_id: str) -> tuple[str | None, str]:
    """gymnasium's `package.module:Id` as (module, Id); (None, id) for a plain id."""
    module, sep, name = env_id.partition(":")
    return (module, name) if sep else (None, env_id)


def wrapper_parts(name: str) -> tuple[str, str]:
    """A wrapper's `package.module:Class` or the RL Zoo's dotted `package.module.Class` as (module, attribute)."""
    module, sep, attribute = name.partition(":")
    if not sep:
        module, _, attribute = name.rpartition(".")
    if not _MODULE.fullmatch(module or "") or not _MODULE.fullmatch(attribute or ""):
        raise ValueError(f"wrapper {name!r} is not package.module:Class (or package.module.Class)")
    return module, attribute


def is_atari_id(env_id: str) -> bool:
    """ALE/ ids and the RL Zoo's *NoFrameskip-v4 ids (both from ale-py): the ones env.atari applies to."""
    return bool(_ATARI_ID.fullmatch(split_env_id(env_id)[1]))


def atari_preprocessing(env_id: str, chosen: str | None) -> str:
    """env.atari.preprocessing, or its default: SB3's for the RL Zoo's *NoFrameskip-v4 ids, gymnasium's for ALE/."""
    return chosen or ("gymnasium" if split_env_id(env_id)[1].startswith("ALE/") else "sb3")


class AtariConfig(StrictModel):
    """The Atari preprocessing: gymnasium's AtariPreprocessing (Machado et al. 2018 settings by
    default) or Stable-Baselines3's AtariWrapper, the one RL Zoo agents were trained behind."""

    preprocessing: Literal["gymnasium", "sb3"] | None = None
    """gymnasium: gymnasium's AtariPreprocessing; sb3: SB3's AtariWrapper with VecFrameStack's
    frame stack (from zeros at every episode boundary), training episodes ending at a lost life with
    rewards clipped to their sign, evaluation over whole games with the game's own rewards. None: sb3
    for *NoFrameskip-v4 ids, gymnasium for ALE/ ids. A ported SB3 Atari CnnPolicy picks sb3."""
    noop_max: Count = 30
    """Up to this many no-op actions at reset, so starts differ."""
    frame_skip: count_from(1) = 4
    """Repeat each action this many frames (max-pooling the last two)."""
    screen_size: count_from(8) = 84
    """Frames are resized to screen_size x screen_size."""
    terminal_on_life_loss: bool | None = None
    """End the (training) episode when a life is lost (the DQN Nature paper's trick). None: as the
    preprocessing does by default, off for gymnasium's (as recommended since), on for SB3's."""
    grayscale_obs: bool = True
    """One luminance channel instead of RGB (SB3's preprocessing is always grayscale)."""
    scale_obs: Literal[False] = False
    """Always False: frames stay uint8 (4x less replay memory); the network scales them."""


class EnvConfig(StrictModel):
    """Which gymnasium environment to train and evaluate on."""

    id: str = Field(min_length=1)
    """A registered gymnasium id, e.g. CartPole-v1, LunarLander-v3, ALE/Breakout-v5 or the RL Zoo's
    BreakoutNoFrameskip-v4, or `package.module:Id` for an environment a module registers when imported
    (gymnasium's form; importing it runs its code, in every process that builds the environment).
    Discrete actions only."""
    kwargs: dict[str, JsonValue] = Field(default_factory=dict)
    """Keyword arguments passed to gymnasium.make (recipe data: YAML scalars, lists and mappings)."""
    max_episode_steps: PositiveCount | None = None
    """Override the environment's time limit (episodes end truncated, and bootstrap). An environment
    registered without one gets 10000 steps (envs/user_env.DEFAULT_MAX_EPISODE_STEPS)."""
    wrappers: list[str | dict[str, JsonValue]] = Field(default_factory=list)
    """gymnasium.Wrapper subclasses applied in order after gymnasium.make: `package.module:Class`, the
    RL Zoo's `package.module.Class`, or {class: NAME, kwargs: {...}}. Anything but a Wrapper subclass is
    refused before it is called."""
    atari: AtariConfig | None = None
    """Atari preprocessing for ALE/ and *NoFrameskip-v4 ids (always applied to them; None: the defaults)."""
    frame_stack: count_from(1) = 1
    """Stack the last k frames on the last axis (4 for Atari); the replay stores each frame once."""

    @model_validator(mode="after")
    def _wrapper_names(self) -> "EnvConfig":
        for i, spec in enumerate(self.wrappers):
            if isinstance(spec, dict):
                if set(spec) - {"class", "kwargs"} or not isinstance(spec.get("class"), str) or \
                        not isinstance(spec.get("kwargs", {}), dict):
                    raise ValueError(f"wrappers[{i}]: write a name or {{class: package.module:Class, kwargs: {{...}}}}, "
                                     f"not {spec!r}")
                spec = spec["class"]
            try:
                wrapper_parts(spec)
            except ValueError as exc:
                raise ValueError(f"wrappers[{i}]: {exc}") from None
        return self

    def user_modules(self) -> list[str]:
        """The modules building this environment imports (and so runs): the id's and the wrappers'."""
        module = split_env_id(self.id)[0]
        names = [spec if isinstance(spec, str) else spec["class"] for spec in self.wrappers]
        return list(dict.fromkeys(([module] if module else []) + [wrapper_parts(n)[0] for n in names]))

    @model_validator(mode="after")
    def _atari_only_for_ale(self) -> "EnvConfig":
        if self.atari is not None and not is_atari_id(self.id):
            raise ValueError(f"atari preprocessing applies to Atari ids only (ALE/... or ...NoFrameskip-v4), "
                             f"not {self.id!r}; remove env.atari")
        if self.atari is not None and self.atari.preprocessing == "sb3" and not self.atari.grayscale_obs:
            raise ValueError("atari.grayscale_obs: SB3's AtariWrapper is always grayscale; remove grayscale_obs: false")
        return self
