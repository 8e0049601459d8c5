"""Stable-Baselines3's Atari preprocessing (AtariWrapper, then VecFrameStack), step for step, without SB3.

RL Zoo DQN agents were trained behind SB3's AtariWrapper: random no-op starts, an action repeated
over 4 frames with the last two max-pooled, FIRE pressed at every reset in games that have it, a
lost life ending the episode, 84x84 grayscale frames, then VecFrameStack's k frames on the last
axis, zeros at every episode boundary. gymnasium's AtariPreprocessing differs in FIRE, lives and
stack padding, so the trajectories differ from the first steps on and a ported agent would be
judged in a game it never saw. The wrappers here repeat SB3's, in SB3's order, so that the frames
an agent sees are SB3's bit for bit (tests/test_atari.py checks it against SB3's make_atari_env);
SB3 is an optional extra and is not imported.

The same frames give two views of an episode:
- training (the default, as SB3 trained: rollouts, TD fine-tunes, training from scratch): a lost
  life ends the episode (reset() then plays on in the same game, as SB3's EpisodicLifeEnv does) and
  rewards are clipped to their sign, the scale of the agent's Q-values;
- whole games (evaluation): an episode is one game, all lives. At a lost life the chain resets as
  SB3's vector env resets it (no-op, FIRE, a stack of zeros) but the episode goes on, and rewards
  are the game's own, unclipped, counted where SB3's Monitor counts them (as the RL Zoo reports).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from compress_dqn.errors import UserError
from compress_dqn.recipe.schema import AtariConfig


class AtariSettings(NamedTuple):
    """The AtariWrapper arguments this preprocessing reproduces; the defaults are SB3's."""

    noop_max: int = 30
    frame_skip: int = 4
    screen_size: int = 84
    terminal_on_life_loss: bool = True

    @classmethod
    def of(cls, config: AtariConfig | None) -> AtariSettings:
        """The recipe's env.atari settings, SB3's defaults where it leaves one unset (None)."""
        if config is None:
            return cls()
        return cls()._replace(**{name: getattr(config, name) for name in cls._fields if getattr(config, name) is not None})

    def differing(self, other: AtariSettings) -> list[str]:
        """The names of the settings whose values differ between the two, in field order."""
        return [name for name, mine, theirs in zip(self._fields, self, other) if mine != theirs]


SB3_DEFAULTS = AtariSettings()


def _lives(env: gym.Env) -> int:
    return int(env.unwrapped.ale.lives())


class GameMonitor(gym.Wrapper):
    """On the raw game, where SB3's Monitor sits: the game's own rewards and whether it is over."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.total, self.over, self.truncated = 0.0, False, False
        self.games = 0
        self.last_game = (0.0, False)  # the previous game's (total, truncated)

    def reset(self, **kwargs: Any) -> Any:
        self.last_game = (self.total, self.truncated)
        self.total, self.over, self.truncated = 0.0, False, False
        self.games += 1
        return self.env.reset(**kwargs)

    def step(self, action: int) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.total += float(reward)
        self.over = bool(terminated or truncated)
        self.truncated = bool(truncated and not terminated)
        return obs, reward, terminated, truncated, info


class NoopReset(gym.Wrapper):
    """SB3's NoopResetEnv: 1..noop_max no-ops after a reset, drawn from the game's np_random."""

    def __init__(self, env: gym.Env, noop_max: int) -> None:
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs: Any) -> Any:
        self.env.reset(**kwargs)
        noops = self.unwrapped.np_random.integers(1, self.noop_max + 1)
        obs, info = np.zeros(0), {}
        for _ in range(noops):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """SB3's MaxAndSkipEnv: the action repeated `skip` frames, rewards summed, the last two frames max-pooled.

    The two-frame buffer is kept across steps as SB3 keeps it: a step cut short by the game's end
    pools a frame of the step before (that observation is never acted on).
    """

    def __init__(self, env: gym.Env, skip: int) -> None:
        super().__init__(env)
        space = env.observation_space
        self._buffer = np.zeros((2, *space.shape), dtype=space.dtype)
        self._skip = skip

    def step(self, action: int) -> Any:
        total, terminated, truncated, info = 0.0, False, False, {}
        for i in range(self._skip):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if i == self._skip - 2:
                self._buffer[0] = obs
            if i == self._skip - 1:
                self._buffer[1] = obs
            total += float(reward)
            if terminated or truncated:
                break
        return self._buffer.max(axis=0), total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """SB3's EpisodicLifeEnv: a lost life ends the episode; reset() after one only plays a no-op."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.was_real_done = True

    def step(self, action: int) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.was_real_done = terminated or truncated
        lives = _lives(self.env)
        if 0 < lives < self.lives:  # above 0: a game that idles at 0 lives resets once, at its real end
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> Any:
        if self.was_real_done:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:  # the no-op ended the game
                obs, info = self.env.reset(**kwargs)
        self.lives = _lives(self.env)
        return obs, info


class FireReset(gym.Wrapper):
    """SB3's FireResetEnv: FIRE then action 2 after every reset, for games that wait for FIRE."""

    def reset(self, **kwargs: Any) -> Any:
        self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(1)
        if terminated or truncated:
            self.env.reset(**kwargs)
        obs, _, terminated, truncated, _ = self.env.step(2)
        if terminated or truncated:
            self.env.reset(**kwargs)
        return obs, {}


class WarpFrame(gym.ObservationWrapper):
    """SB3's WarpFrame: OpenCV's RGB-to-gray, then an INTER_AREA resize to size x size."""

    def __init__(self, env: gym.Env, size: int) -> None:
        super().__init__(env)
        try:
            import cv2  # an optional extra, as for gymnasium's AtariPreprocessing
        except ImportError:
            raise UserError("env.id: Atari preprocessing needs OpenCV; pip install opencv-python-headless") from None
        self._cv2, self.size = cv2, size
        self.observation_space = gym.spaces.Box(0, 255, (size, size), dtype=np.uint8)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        gray = self._cv2.cvtColor(frame, self._cv2.COLOR_RGB2GRAY)
        return self._cv2.resize(gray, (self.size, self.size), interpolation=self._cv2.INTER_AREA)


class SB3Stack(gym.Wrapper):
    """VecFrameStack on one game, with SB3's reward clipping (training) or whole games (evaluation).

    The stack holds the last k frames on the last axis, newest last, and restarts from zeros at
    every episode boundary SB3's vector env sees, a lost life included. With k=1 observations are
    plain (size, size) frames, as gymnasium's AtariPreprocessing gives them.
    """

    def __init__(self, env: gym.Env, game: GameMonitor, lives: EpisodicLife | None, k: int, whole_games: bool) -> None:
        super().__init__(env)
        size = env.observation_space.shape[0]
        self.k, self.whole_games, self._game, self._lives = int(k), whole_games, game, lives
        self.settings = SB3_DEFAULTS  # the AtariWrapper arguments it plays with (sb3_atari sets them)
        shape = (size, size) if self.k == 1 else (size, size, self.k)
        self.observation_space = gym.spaces.Box(0, 255, shape, dtype=np.uint8)
        self._stack = np.zeros((size, size, self.k), dtype=np.uint8)
        self._pending: np.ndarray | None = None  # a game begun inside a lost life's reset (whole games)
        self._reported = 0.0

    def _push(self, frame: np.ndarray, restart: bool = False) -> np.ndarray:
        if restart:
            self._stack[...] = 0
        self._stack[..., :-1] = self._stack[..., 1:]
        self._stack[..., -1] = frame
        return self._stack[..., 0].copy() if self.k == 1 else self._stack.copy()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        if self._pending is not None and seed is None and options is None:
            frame, info = self._pending, {}
        else:
            if self.whole_games and self._lives is not None:
                self._lives.was_real_done = True  # every evaluation episode is a new game
            frame, info = self.env.reset(seed=seed, options=options)
        self._pending, self._reported = None, 0.0
        return self._push(frame, restart=True), info

    def step(self, action: int) -> Any:
        frame, reward, terminated, truncated, info = self.env.step(action)
        if not self.whole_games:
            return self._push(frame), float(np.sign(reward)), terminated, truncated, info
        games, restart = self._game.games, False
        if (terminated or truncated) and not self._game.over:  # a lost life: SB3's vec env resets here
            frame, _ = self.env.reset()
            restart = True
        if self._game.games != games:  # that reset's no-op ended the game and began the next one
            self._pending = frame
            total, cut = self._game.last_game
            over = True
        else:
            total, cut, over = self._game.total, self._game.truncated, self._game.over
        reward, self._reported = total - self._reported, total
        return self._push(frame, restart), reward, over and not cut, over and cut, info


def sb3_atari(env: gym.Env, settings: AtariSettings, frame_stack: int, whole_games: bool) -> gym.Env:
    """Wrap a raw Atari game (one frame per step) as SB3's make_atari_env + VecFrameStack(frame_stack) would."""
    meanings = env.unwrapped.get_action_meanings()
    if settings.noop_max > 0 and meanings[0] != "NOOP":
        raise UserError(f"env.atari: SB3's no-op starts need action 0 to be NOOP, this game's is {meanings[0]}")
    if "FIRE" in meanings and (meanings[1] != "FIRE" or len(meanings) < 3):
        raise UserError(f"env.atari: SB3's FIRE reset needs FIRE as action 1 of 3 or more, this game has {meanings}")
    game = inner = GameMonitor(env)
    if settings.noop_max > 0:
        inner = NoopReset(inner, int(settings.noop_max))
    if settings.frame_skip > 1:
        inner = MaxAndSkip(inner, int(settings.frame_skip))
    lives = EpisodicLife(inner) if settings.terminal_on_life_loss else None
    inner = lives or inner
    if "FIRE" in meanings:
        inner = FireReset(inner)
    inner = WarpFrame(inner, int(settings.screen_size))
    stack = SB3Stack(inner, game, lives, frame_stack, whole_games)
    stack.settings = settings
    return stack


def describe(settings: AtariSettings, frame_stack: int) -> str:
    """One line for notes and reports: which Atari preprocessing plays."""
    life = "a lost life ends a training episode" if settings.terminal_on_life_loss else "episodes are whole games"
    return (f"SB3's AtariWrapper (noop_max {settings.noop_max}, frame skip {settings.frame_skip} max-pooled, "
            f"FIRE on reset, {settings.screen_size}x{settings.screen_size} grayscale, {life}; training rewards "
            f"clipped to their sign) with {frame_stack} stacked frames from zeros; returns are whole games, unclipped")
