"""Environments: gymnasium ids with kwargs, discrete actions only, seeded from the recipe.

Any gymnasium id, or `package.module:Id` for one a module registers when imported (envs/user_env.py,
with env.wrappers). Observations are Boxes: one of float values with two or more axes is flattened in
C order (as SB3's FlattenExtractor does), so a policy of it takes flat vectors like any other; float64
values are taken as float32, as SB3's policies take them.

Image environments: Atari ids (`ALE/...` and the RL Zoo's `*NoFrameskip-v4`, from ale-py) get an
Atari preprocessing (no-op starts, frame skip 4 with max-pooling, 84x84 grayscale uint8): gymnasium's
AtariPreprocessing, the default for ALE/ ids, or Stable-Baselines3's AtariWrapper (envs/atari.py),
the default for *NoFrameskip-v4 ids, the one RL Zoo agents were trained behind. MinAtar ids
(`MinAtar/...`) get their bool channels as uint8. `frame_stack: k` stacks the last k frames on the
last axis (channels-last, as Conv2D wants); a new episode's stack is k copies of its first frame,
the padding the replay buffer assumes when it rebuilds stacks, except under SB3's preprocessing,
whose stack starts from zeros as SB3's VecFrameStack does (the replay stores those stacks exactly).

Exact resume needs the environment's random state: for the classic-control, Box2D and MinAtar
environments an episode is fully determined by the generator(s) `rng_state`/`set_rng_state`
capture as plain JSON-able data (no pickle). Atari's emulator state is not captured: an Atari
run resumes, but not bit-for-bit.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from compress_dqn._quiet import quiet_stderr
from compress_dqn.envs.atari import AtariSettings, SB3Stack, sb3_atari
from compress_dqn.errors import UserError
from compress_dqn.envs.user_env import DEFAULT_MAX_EPISODE_STEPS, apply_wrappers, import_env_module, needs_time_limit
from compress_dqn.recipe.env import split_env_id
from compress_dqn.recipe.schema import AtariConfig, atari_preprocessing, is_atari_id


@dataclass(frozen=True)
class EnvInfo:
    """What the network and the replay buffer need to know about an environment."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int
    frame_stack: int = 1
    """Observations are stacks of this many frames on the last axis (1: no stacking)."""
    input_scale: float | None = None
    """Integer observations are multiplied by this inside the network (1/255 for pixels)."""
    atari: str | None = None
    """Which Atari preprocessing plays: 'sb3' (SB3's AtariWrapper), 'gymnasium' or None (not Atari)."""
    atari_settings: AtariSettings | None = None
    """Under SB3's preprocessing, the AtariWrapper arguments it plays with."""


def _registered_ids() -> list[str]:
    return sorted(gym.envs.registry.keys())


def check_env_id(env_id: str) -> None:
    """Fail with a did-you-mean when the id is not registered (cheap: no environment is built); a
    `package.module:Id` id imports its module first, as gymnasium.make does (envs/user_env.py)."""
    if split_env_id(env_id)[0] is not None:
        import_env_module(env_id)
        return
    _import_env_packages(env_id)
    if env_id in gym.envs.registry:
        return
    close = difflib.get_close_matches(env_id, _registered_ids(), n=3, cutoff=0.6)
    hint = (f"; did you mean {', '.join(close)}?" if close else
            "; see gymnasium.envs.registry for valid ids, or name the module that registers it: package.module:Id")
    raise UserError(f"env.id: {env_id!r} is not a registered gymnasium environment{hint}")


def _import_env_packages(env_id: str) -> None:
    """Atari ids live in ale-py and MinAtar ids in minatar; both register them on request."""
    if is_atari_id(env_id):
        try:
            import ale_py

            gym.register_envs(ale_py)
        except ImportError:
            raise UserError(f"env.id: {env_id!r} needs ale-py; pip install ale-py") from None
    if env_id.startswith("MinAtar/") and not any(key.startswith("MinAtar/") for key in gym.envs.registry):
        try:
            from minatar.gym import register_envs
        except ImportError:
            raise UserError(f"env.id: {env_id!r} needs minatar; pip install minatar") from None
        register_envs()


def is_atari(env_id: str) -> bool:
    """ALE/ ids and the RL Zoo's *NoFrameskip-v4 ids: the Atari ids that get a preprocessing."""
    return is_atari_id(env_id)


class FrameStack(gym.ObservationWrapper):
    """The last k frames stacked on a new last axis; a new episode starts with k copies of its first frame.

    gymnasium's FrameStackObservation stacks on the first axis; Conv2D wants channels last, and the
    replay buffer's stack rebuild assumes this padding, so the wrapper is ours.
    """

    def __init__(self, env: gym.Env, k: int) -> None:
        super().__init__(env)
        space = env.observation_space
        self.k = int(k)
        self.observation_space = gym.spaces.Box(
            np.repeat(np.asarray(space.low)[..., None], self.k, axis=-1),
            np.repeat(np.asarray(space.high)[..., None], self.k, axis=-1),
            dtype=space.dtype,
        )
        self._frames = np.zeros(self.observation_space.shape, dtype=space.dtype)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._frames[...] = np.asarray(obs)[..., None]
        return self._frames.copy(), info

    def observation(self, observation: np.ndarray) -> np.ndarray:
        self._frames[..., :-1] = self._frames[..., 1:]
        self._frames[..., -1] = observation
        return self._frames.copy()


class BoolToUint8(gym.ObservationWrapper):
    """MinAtar's bool channels as uint8 0/1: numpy, TensorFlow and TFLite all take uint8."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        shape = env.observation_space.shape
        self.observation_space = gym.spaces.Box(0, 1, shape=shape, dtype=np.uint8)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.uint8)


class Float32Observation(gym.ObservationWrapper):
    """float64 observations as float32, bounds cast first (gymnasium's DtypeObservation warns on every make)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(np.asarray(space.low, np.float32), np.asarray(space.high, np.float32),
                                                dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)


def make_env(
    env_id: str,
    kwargs: dict[str, Any] | None = None,
    max_episode_steps: int | None = None,
    atari: AtariConfig | None = None,
    frame_stack: int = 1,
    whole_games: bool = False,
    wrappers: list[Any] | None = None,
) -> gym.Env:
    """Build an environment with its preprocessing and check it has a discrete action space.

    atari: the recipe's env.atari section for Atari ids (None: the defaults of the id's
    preprocessing); the base environment is made with frameskip=1 because the wrapper skips.
    whole_games: episodes for evaluation (SB3's Atari preprocessing only: whole games with the
    game's own rewards; its default episodes are SB3's training ones, a life each, rewards clipped).
    wrappers: env.wrappers, applied in order after gymnasium.make (and its time limit).
    """
    check_env_id(env_id)
    options: dict[str, Any] = dict(kwargs or {})
    if max_episode_steps is not None:
        options["max_episode_steps"] = max_episode_steps
    if is_atari(env_id):
        options.setdefault("frameskip", 1)
    env = _make(env_id, options)
    if not (is_atari(env_id) or env_id.startswith("MinAtar/")) and needs_time_limit(env):
        # an episode that never ends would hang evaluation; Atari and MinAtar games end on their own
        env = gym.wrappers.TimeLimit(env, DEFAULT_MAX_EPISODE_STEPS)
    env = _check_spaces(apply_wrappers(env, list(wrappers or [])), env_id, bool(wrappers))
    if is_atari(env_id):
        if atari_preprocessing(env_id, atari.preprocessing if atari else None) == "sb3":
            return sb3_atari(env, AtariSettings.of(atari), frame_stack, whole_games)
        env = _gymnasium_atari(env, atari)
    if len(env.observation_space.shape) >= 2 and np.dtype(env.observation_space.dtype).kind == "f":
        # a float table (highway-env's 5x5 kinematics): flat, in C order, as SB3's FlattenExtractor takes it
        env = gym.wrappers.FlattenObservation(env)
    if env.observation_space.dtype == np.float64:  # float32, as SB3's policies (and TFLite) take them
        env = Float32Observation(env)
    if env.observation_space.dtype == np.bool_:
        env = BoolToUint8(env)
    if frame_stack > 1:
        env = FrameStack(env, frame_stack)
    return env


def _make(env_id: str, options: dict[str, Any]) -> gym.Env:
    """gym.make with its errors as one line each, and the checks every environment must pass."""
    try:
        with quiet_stderr():  # ALE prints its banner on stderr
            env = gym.make(env_id, **options)
    except gym.error.DependencyNotInstalled as exc:
        raise UserError(f"env.id: {env_id!r} needs an extra package: {str(exc).splitlines()[0]}") from None
    except gym.error.Error as exc:  # unregistered versions, bad render modes: gymnasium's own
        raise UserError(f"env: {env_id!r}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    except Exception as exc:  # TypeError for unknown kwargs; Assertion/Value/RuntimeError for bad values
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"env.kwargs: {env_id!r} rejected them ({reason}); fix env.kwargs or env.max_episode_steps") from None
    return env


def _check_spaces(env: gym.Env, env_id: str, wrapped: bool) -> gym.Env:
    """A Discrete action space and a Box observation space (any shape: networks flatten it as SB3's
    FlattenExtractor does), or one line saying which wrapper gives one."""
    where = f"env.id: {env_id!r}" + (" behind env.wrappers" if wrapped else "")
    if not isinstance(env.action_space, gym.spaces.Discrete):
        space = env.action_space
        env.close()
        raise UserError(
            f"{where} has action space {space}; DQN needs a Discrete action space "
            "(pick a discrete variant, e.g. LunarLander-v3 instead of continuous=True)"
        )
    if not isinstance(env.observation_space, gym.spaces.Box):
        space = env.observation_space
        env.close()
        flattens = isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple, gym.spaces.Discrete, gym.spaces.MultiDiscrete,
                                      gym.spaces.MultiBinary))
        fix = ("add env.wrappers: [gymnasium.wrappers:FlattenObservation] (a flat Box; Discrete becomes one-hot)"
               if flattens else "add an env.wrappers entry whose observations are a Box")
        raise UserError(f"{where} has observation space {str(space)[:200]}; only Box observations are taken: {fix}")
    return env


def _gymnasium_atari(env: gym.Env, atari: AtariConfig | None) -> gym.Env:
    """gymnasium's AtariPreprocessing with the recipe's settings (its own defaults where unset)."""
    # the config's fields are AtariPreprocessing's keyword arguments, by design
    arguments = atari.model_dump(exclude={"preprocessing"}, exclude_none=True) if atari is not None else {}
    try:
        return gym.wrappers.AtariPreprocessing(env, **arguments)
    except (TypeError, ValueError) as exc:
        env.close()
        raise UserError(f"env.atari: AtariPreprocessing rejected it: {exc}") from None
    except gym.error.DependencyNotInstalled:
        env.close()
        raise UserError("env.id: Atari preprocessing needs OpenCV; pip install opencv-python-headless") from None


def make_env_from(cfg: Any, whole_games: bool = False) -> gym.Env:
    """make_env from a recipe's env section (an EnvConfig); whole_games for evaluation episodes."""
    return make_env(cfg.id, cfg.kwargs, cfg.max_episode_steps, cfg.atari, cfg.frame_stack, whole_games,
                    getattr(cfg, "wrappers", None))


def probe_env(cfg: Any) -> EnvInfo:
    """Build the environment a recipe's env section describes just to read its shapes, then close it."""
    env = make_env_from(cfg)
    try:
        return env_info(env, cfg.id)
    finally:
        env.close()


def env_info(env: gym.Env, env_id: str) -> EnvInfo:
    """Shapes and sizes of an environment built by make_env."""
    space = env.observation_space
    dtype = np.dtype(space.dtype)
    input_scale = None
    if dtype.kind in "iu":
        high = float(np.max(space.high))
        input_scale = 1.0 / high if high > 0 else 1.0
    atari = "sb3" if isinstance(env, SB3Stack) else ("gymnasium" if is_atari(env_id) else None)
    return EnvInfo(
        env_id=env_id,
        obs_shape=tuple(int(d) for d in space.shape),
        obs_dtype=dtype,
        n_actions=int(env.action_space.n),
        frame_stack=env.k if isinstance(env, (FrameStack, SB3Stack)) else 1,
        input_scale=input_scale,
        atari=atari,
        atari_settings=env.settings if isinstance(env, SB3Stack) else None,
    )


def is_image(info: EnvInfo) -> bool:
    """Image observations, the ones the image presets (and conv layers) are for: integer pixels or
    channels of 2 or more axes (Atari frames, MinAtar's channels). A float Box of any shape (a 5x5
    kinematics table, stacked vectors) is flat: the network flattens it, as SB3's FlattenExtractor does."""
    return len(info.obs_shape) >= 2 and info.input_scale is not None


def seed_env(env: gym.Env, seed: int) -> np.ndarray:
    """Seed the environment and its action space; returns the first observation."""
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    return obs


def reset_episode(env: gym.Env, seed: int) -> np.ndarray:
    """The first observation of an evaluation episode on `seed`, one that depends on its seed alone.

    Why: MinAtar keeps the previous episode's last action across reset(seed=...) and may repeat it
    (sticky actions) at the next episode's first step, so an environment that played other episodes
    before could start this one differently from a fresh one. Here a MinAtar episode starts as in a
    fresh environment (last action no-op). Its reseeding reseeds the game's RandomState in place,
    which gives the state RandomState(seed) gives without building a generator (a fifth of a
    millisecond) per episode. Other environments: reset(seed=seed).
    """
    game = getattr(env.unwrapped, "game", None)
    random = _minatar_random(env)
    if random is None or not hasattr(game, "last_action") or not hasattr(game, "env"):
        return env.reset(seed=int(seed))[0]
    random.seed(int(seed))  # what minatar's Environment.seed does, into the RandomState it holds
    game.env.random = random
    game.last_action = 0
    return env.reset()[0]


def _minatar_random(env: gym.Env) -> np.random.RandomState | None:
    """MinAtar keeps its own RandomState (sticky actions, ball start) outside np_random."""
    game = getattr(env.unwrapped, "game", None)
    random = getattr(game, "random", None)
    return random if isinstance(random, np.random.RandomState) else None


def rng_state(env: gym.Env) -> str:
    """The environment's random state as a JSON string (for checkpoints)."""
    data: dict[str, Any] = {"np_random": env.unwrapped.np_random.bit_generator.state}
    legacy = _minatar_random(env)
    if legacy is not None:
        name, keys, pos, has_gauss, cached = legacy.get_state()
        data["minatar"] = [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    return json.dumps(data)


def set_rng_state(env: gym.Env, state: str) -> None:
    """Restore a state captured by rng_state, so the next reset() continues the same stream."""
    data = json.loads(state)
    if "np_random" not in data:  # a checkpoint written before MinAtar support
        data = {"np_random": data}
    generator_state = data["np_random"]
    bit_generator = getattr(np.random, generator_state["bit_generator"])()
    bit_generator.state = generator_state
    env.unwrapped.np_random = np.random.Generator(bit_generator)
    legacy = _minatar_random(env)
    if legacy is not None and "minatar" in data:
        name, keys, pos, has_gauss, cached = data["minatar"]
        legacy.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
