"""Environments played side by side: a row of lanes, each playing one episode at a time on its seed.

A lane starts an episode on a seed as reset_episode does (the episode depends on its seed alone)
and steps it until it ends; the player (envs/episodes.py) then starts the next seed in that lane.
The lanes' observations live in one array of rows, which is the batch the policy sees.

Two kinds: `GymLanes`, a gymnasium environment per lane built by make_env_from (any environment),
and numpy lanes, a MinAtar game's rules computed for every lane at once with numpy: `BreakoutLanes`
and `SpaceInvadersLanes`. A MinAtar game is a few lines of Python per step, called through four
gymnasium wrappers, which cost more per step than a batched policy does; the numpy copy computes
the same observations, rewards and ends (each lane's draws come from RandomState(seed) in the order
MinAtar draws them), and is used only with the MinAtar version it was checked against
(tests/test_lanes.py plays both step by step).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import metadata
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from compress_dqn.envs.environment import BoolToUint8, make_env_from, reset_episode

BREAKOUT_CHECKED_MINATAR = ("1.0.15",)
"""MinAtar versions whose Breakout BreakoutLanes was checked against, step by step."""
SPACE_INVADERS_CHECKED_MINATAR = ("1.0.15",)
"""MinAtar versions whose Space Invaders SpaceInvadersLanes was checked against, step by step."""


class Lanes(Protocol):
    """What the side-by-side player needs: rows of observations, episodes started and stepped per lane."""

    obs: np.ndarray
    """(lanes, *observation shape): each lane's current observation, the policy's batch."""

    def start(self, lane: int, seed: int) -> None: ...

    def step(self, actions: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Step `lanes` (indices) with `actions` (one per lane given): (rewards, ended) per lane given."""
        ...

    def close(self) -> None: ...


class GymLanes:
    """One gymnasium environment per lane (make_env_from, evaluation episodes)."""

    def __init__(self, env: Any, width: int) -> None:
        self._envs: list[gym.Env] = []
        try:
            for _ in range(width):
                self._envs.append(make_env_from(env, whole_games=True))
        except BaseException:
            self.close()
            raise
        self.obs = np.zeros((0,))  # shaped by the first observation: its dtype, not the space's, is what a policy sees

    def start(self, lane: int, seed: int) -> None:
        first = reset_episode(self._envs[lane], seed)
        if self.obs.shape[1:] != np.shape(first) or self.obs.dtype != np.asarray(first).dtype:
            self.obs = np.zeros((len(self._envs), *np.shape(first)), dtype=np.asarray(first).dtype)
        self.obs[lane] = first

    def step(self, actions: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rewards = np.zeros(len(lanes))
        ended = np.zeros(len(lanes), dtype=bool)
        for k, lane in enumerate(lanes.tolist()):
            self.obs[lane], reward, terminated, truncated, _ = self._envs[lane].step(int(actions[k]))
            rewards[k] = float(reward)
            ended[k] = terminated or truncated
        return rewards, ended

    def close(self) -> None:
        for instance in self._envs:
            instance.close()


_DRAWS = 1024  # uniform draws taken from a lane's stream at a time (the same stream, in blocks)


class _Draws:
    """Each lane's stream of RandomState(seed) after the draws its episode's reset takes (`skip`):
    the uniform that minatar's Environment.act draws for its sticky action at every step."""

    def __init__(self, width: int, skip) -> None:
        self.random = np.random.RandomState(0)  # one generator, reseeded per lane: building one costs 0.1 ms
        self._skip = skip  # skip(random): the reset's draws, what they give
        self._seeds = [0] * width
        self._blocks = [0] * width  # blocks of draws taken from each lane's stream so far
        self._draws = np.zeros((width, _DRAWS))
        self._drawn = np.zeros(width, dtype=np.intp)

    def start(self, lane: int, seed: int):
        """The lane's stream from RandomState(seed): what its reset's draws give."""
        random = self.random
        random.seed(int(seed))
        skipped = self._skip(random)
        self._draws[lane] = random.random_sample(_DRAWS)
        self._drawn[lane] = 0
        self._seeds[lane], self._blocks[lane] = int(seed), 1
        return skipped

    def next(self, lanes: np.ndarray) -> np.ndarray:
        """Each lane's next random_sample() (Environment.act draws one per step)."""
        drawn = self._drawn[lanes]
        u = self._draws[lanes, drawn]
        drawn += 1
        self._drawn[lanes] = drawn
        for lane in lanes[drawn == _DRAWS].tolist():  # the lane's next block: its stream drawn again up to there
            self.random.seed(self._seeds[lane])
            self._skip(self.random)
            self._blocks[lane] += 1
            self._draws[lane] = self.random.random_sample(_DRAWS * self._blocks[lane])[-_DRAWS:]
            self._drawn[lane] = 0
        return u


# Breakout's ball directions 0..3 (up-left, up-right, down-right, down-left) and the rebounds that
# MinAtar writes as lists indexed by direction.
_DX = np.array([-1, 1, 1, -1])
_DY = np.array([-1, -1, 1, 1])
_FLIP_X = np.array([1, 0, 3, 2])  # off a side wall
_FLIP_Y = np.array([3, 2, 1, 0])  # off the top, a brick, or the paddle's middle
_FLIP_CORNER = np.array([2, 3, 0, 1])  # off the paddle's corner
_MOVE = np.array([0, -1, 0, 1, 0, 0])  # the paddle's (and the cannon's) move for each of MinAtar's full action ids (n l u r d f)
# Rows of BreakoutLanes._state: ball x and y, its direction, the paddle, the ball's last x and y,
# the last action (full id), steps played.
_BX, _BY, _DIR, _POS, _LX, _LY, _LAST, _STEPS = range(8)


class BreakoutLanes:
    """MinAtar Breakout (minatar.environments.breakout, with minatar's sticky actions and an optional
    step limit) for every lane at once; observations as BoolToUint8 gives them (paddle, ball,
    trail, bricks). The bricks live in the observations' last channel."""

    def __init__(self, width: int, action_set: list[int], sticky: float, max_steps: int | None) -> None:
        self._action_set = np.asarray(action_set)
        self._sticky, self._max_steps = float(sticky), max_steps
        self._draws = _Draws(width, lambda random: random.randint(2))  # the ball's start
        self._state = np.zeros((8, width), dtype=np.intp)
        self._strike = np.zeros(width, dtype=bool)
        self._all = np.arange(width)
        self.obs = np.zeros((width, 10, 10, 4), dtype=np.uint8)
        self._bricks = self.obs[..., 3]

    def start(self, lane: int, seed: int) -> None:
        """minatar's reset after Environment.seed(seed), with the last action a fresh Environment has."""
        x, direction = [(0, 2), (9, 3)][self._draws.start(lane, seed)]
        self._state[:, lane] = (x, 3, direction, 4, x, 3, 0, 0)
        self._strike[lane] = False
        self.obs[lane] = 0
        self._bricks[lane, 1:4, :] = 1
        self.obs[lane, 9, 4, 0] = self.obs[lane, 3, x, 1] = self.obs[lane, 3, x, 2] = 1

    def step(self, actions: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """minatar's Environment.act then Env.act, for each lane given (none of them terminal)."""
        rows = slice(None) if len(lanes) == len(self._all) else lanes  # all lanes: no index arrays to follow
        before = self._state[:, rows].copy()  # a copy: the state is written back from its rows
        ball_x, ball_y, direction = before[_BX], before[_BY], before[_DIR]
        act = np.where(self._draws.next(lanes) < self._sticky, before[_LAST], self._action_set[actions])
        pos = np.minimum(np.maximum(before[_POS] + _MOVE[act], 0), 9)
        new_x, new_y = ball_x + _DX[direction], ball_y + _DY[direction]
        direction = np.where((new_x < 0) | (new_x > 9), _FLIP_X[direction], direction)
        new_x = np.minimum(np.maximum(new_x, 0), 9)
        top = new_y < 0
        new_y = np.maximum(new_y, 0)
        direction = np.where(top, _FLIP_Y[direction], direction)
        brick = self._bricks[lanes, new_y, new_x] == 1  # row 0, the top, never holds bricks
        hit = brick & ~self._strike[rows]  # a brick breaks unless the ball struck one the step before
        terminal = np.zeros(len(lanes), dtype=bool)
        if np.count_nonzero(hit):
            self._bricks[lanes[hit], new_y[hit], new_x[hit]] = 0
            new_y = np.where(hit, ball_y, new_y)
            direction = np.where(hit, _FLIP_Y[direction], direction)
        bottom = ~brick & (new_y == 9)  # new_y is 0 where the ball left the top
        if np.count_nonzero(bottom):  # the ball at the bottom row: a few steps in ten
            new_y, direction, terminal = self._bottom(lanes, bottom, pos, ball_x, ball_y, new_x, new_y, direction)
        self._strike[rows] = brick
        self._observe(lanes, before, pos, new_x, new_y)
        steps = before[_STEPS] + 1
        self._state[:, rows] = (new_x, new_y, direction, pos, ball_x, ball_y, act, steps)
        if self._max_steps is not None:  # gymnasium's TimeLimit
            terminal = terminal | (steps >= self._max_steps)
        return hit.astype(np.float64), terminal

    def _bottom(self, lanes: np.ndarray, bottom: np.ndarray, pos: np.ndarray, ball_x: np.ndarray, ball_y: np.ndarray,
                new_x: np.ndarray, new_y: np.ndarray, direction: np.ndarray) -> tuple[np.ndarray, ...]:
        """The ball reaching the bottom row: new bricks if none are left, then the paddle or the end."""
        for lane in lanes[bottom].tolist():
            if not self._bricks[lane].any():
                self._bricks[lane, 1:4, :] = 1
        middle = bottom & (ball_x == pos)
        corner = bottom & ~middle & (new_x == pos)
        direction = np.where(middle, _FLIP_Y[direction], np.where(corner, _FLIP_CORNER[direction], direction))
        new_y = np.where(middle | corner, ball_y, new_y)
        return new_y, direction, bottom & ~middle & ~corner

    def _observe(self, lanes: np.ndarray, before: np.ndarray, pos: np.ndarray, new_x: np.ndarray,
                 new_y: np.ndarray) -> None:
        """Env.state() into the lanes' rows: the paddle, ball and trail marks move; the bricks are there."""
        obs = self.obs
        obs[lanes, 9, before[_POS], 0] = 0
        obs[lanes, before[_BY], before[_BX], 1] = 0
        obs[lanes, before[_LY], before[_LX], 2] = 0
        obs[lanes, 9, pos, 0] = 1
        obs[lanes, new_y, new_x, 1] = 1
        obs[lanes, before[_BY], before[_BX], 2] = 1

    def close(self) -> None:
        pass


# Space Invaders' constants (minatar.environments.space_invaders) and the per-lane numbers of
# SpaceInvadersLanes._state: the cannon, the aliens' direction (-1 left, 1 right), their move
# interval (12, down to 6 as waves are cleared), the alien move and shot timers, the cannon's
# cool-down, the last action (full id), steps played, aliens left.
_SHOT_COOL_DOWN, _ENEMY_MOVE_INTERVAL, _ENEMY_SHOT_INTERVAL = 5, 12, 10
_CANNON, _ADIR, _INTERVAL, _MOVE_T, _SHOT_T, _COOL, _ALAST, _ASTEPS, _ALIENS = range(9)
_FIRE = 5  # MinAtar's full action id of 'f'
_COLUMNS = np.arange(10)
_WAVE = np.zeros((10, 10), dtype=bool)
_WAVE[0:4, 2:8] = True  # a new wave of 24 aliens
_CELLS = np.arange(100)
_SHOWN = np.array([[1, 0, 1], [1, 1, 0]], dtype=np.uint8)  # alien channels 1..3 of an alien moving right, left


class SpaceInvadersLanes:
    """MinAtar Space Invaders (minatar.environments.space_invaders, with minatar's sticky actions,
    difficulty ramping on or off, and an optional step limit) for every lane at once; observations
    as BoolToUint8 gives them (cannon, alien, alien moving left, alien moving right, the cannon's
    bullets, the aliens' bullets). The game draws nothing of its own: the only draw is the sticky
    action's, one a step, from RandomState(seed).

    The bullets live in the observations' last two channels, shifted a row each step (the cannon's
    also in a map of their own, `_friendly`, to find them fast); the aliens in `_aliens`, copied
    into the alien channels only for the lanes whose aliens moved or came anew: most steps most
    lanes' aliens stay where they are."""

    def __init__(self, width: int, action_set: list[int], sticky: float, max_steps: int | None,
                 ramping: bool = True) -> None:
        self._action_set = np.asarray(action_set)
        self._sticky, self._max_steps, self._ramping = float(sticky), max_steps, bool(ramping)
        self._draws = _Draws(width, lambda random: None)  # Env.reset draws nothing
        self._state = np.zeros((9, width), dtype=np.intp)
        self._aliens = np.zeros((width, 10, 10), dtype=bool)
        self._friendly = np.zeros((width, 10, 10), dtype=bool)
        self._all = np.arange(width)
        self.obs = np.zeros((width, 10, 10, 6), dtype=np.uint8)

    def start(self, lane: int, seed: int) -> None:
        """minatar's reset after Environment.seed(seed), with the last action a fresh Environment has."""
        self._draws.start(lane, seed)
        self._state[:, lane] = (5, -1, _ENEMY_MOVE_INTERVAL, _ENEMY_MOVE_INTERVAL, _ENEMY_SHOT_INTERVAL, 0, 0, 0,
                                _WAVE.sum())
        self._aliens[lane] = _WAVE
        self._friendly[lane] = False
        self.obs[lane] = 0
        self.obs[lane, 9, 5, 0] = 1
        self._show_aliens(np.array([lane]), np.array([-1]))

    def step(self, actions: np.ndarray, lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """minatar's Environment.act then Env.act, for each lane given (none of them terminal)."""
        lanes = np.asarray(lanes)
        n, obs, aliens, friendly = len(lanes), self.obs, self._aliens, self._friendly
        rows = slice(None) if n == len(self._all) and np.array_equal(lanes, self._all) else lanes
        state = self._state[:, rows].copy()  # written back whole at the end
        pos, direction, interval, move_timer, shot_timer, cool, count = (
            state[_CANNON], state[_ADIR], state[_INTERVAL], state[_MOVE_T], state[_SHOT_T], state[_COOL], state[_ALIENS])

        act = np.where(self._draws.next(lanes) < self._sticky, state[_ALAST], self._action_set[np.asarray(actions)])
        fire = (act == _FIRE) & (cool == 0)
        cool = np.where(fire, _SHOT_COOL_DOWN, cool)
        obs[lanes, 9, pos, 0] = 0
        new_pos = np.minimum(np.maximum(pos + _MOVE[act], 0), 9)  # firing moves nothing: its move is 0
        obs[lanes, 9, new_pos, 0] = 1

        ours = self._shift_bullets(lanes, rows, fire, pos)
        pos = new_pos
        terminal = (obs[lanes, 9, pos, 5] == 1) | aliens[lanes, 9, pos]
        shown = np.zeros(n, dtype=bool)  # lanes whose alien channels are written from their map
        moving = move_timer == 0
        if np.count_nonzero(moving):
            self._march(lanes, np.flatnonzero(moving), pos, direction, move_timer, interval, count, terminal, shown)
        shooting = shot_timer == 0
        if np.count_nonzero(shooting):
            shot_timer[shooting] = _ENEMY_SHOT_INTERVAL
            self._shoot(lanes[shooting], pos[shooting])
        rewards, count = self._hits(lanes, ours, count)

        cool = cool - (cool > 0)
        move_timer -= 1
        shot_timer -= 1
        cleared = count == 0
        if np.count_nonzero(cleared):
            if self._ramping:
                interval = np.where(cleared & (interval > 6), interval - 1, interval)
            aliens[lanes[cleared]] |= _WAVE
            count = np.where(cleared, _WAVE.sum(), count)
            shown |= cleared

        if not isinstance(rows, slice):
            friendly[lanes] = ours
        if np.count_nonzero(shown):
            self._show_aliens(lanes[shown], direction[shown])
        state[_CANNON], state[_ADIR], state[_INTERVAL], state[_ALIENS] = pos, direction, interval, count
        state[_MOVE_T], state[_SHOT_T], state[_COOL], state[_ALAST] = move_timer, shot_timer, cool, act
        state[_ASTEPS] += 1
        self._state[:, rows] = state
        if self._max_steps is not None:  # gymnasium's TimeLimit
            terminal = terminal | (state[_ASTEPS] >= self._max_steps)
        return rewards, terminal

    def _shift_bullets(self, lanes: np.ndarray, rows: slice | np.ndarray, fire: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """The bullets: the cannon's a row up (MinAtar's np.roll(-1) and its bottom row cleared), one
        fired from the cannon's column before it moved; the aliens' a row down (roll(1), top cleared).
        Returns the lanes' map of the cannon's bullets (a view of `_friendly` when every lane steps)."""
        obs, friendly = self.obs, self._friendly
        if isinstance(rows, slice):
            obs[:, :9, :, 4] = obs[:, 1:, :, 4]  # numpy copies overlapping views as if through a buffer
            obs[:, 9, :, 4] = 0
            obs[:, 1:, :, 5] = obs[:, :9, :, 5]
            obs[:, 0, :, 5] = 0
            friendly[:, :9] = friendly[:, 1:]
            friendly[:, 9] = False
            ours = friendly
        else:
            mine, theirs = obs[lanes, :, :, 4], obs[lanes, :, :, 5]
            obs[lanes, :9, :, 4], obs[lanes, 9, :, 4] = mine[:, 1:], 0
            obs[lanes, 1:, :, 5], obs[lanes, 0, :, 5] = theirs[:, :9], 0
            ours = friendly[lanes]
            ours[:, :9], ours[:, 9] = ours[:, 1:].copy(), False
        if np.count_nonzero(fire):
            obs[lanes[fire], 8, pos[fire], 4] = 1
            ours[np.flatnonzero(fire), 8, pos[fire]] = True
        return ours

    def _march(self, lanes: np.ndarray, at: np.ndarray, pos: np.ndarray, direction: np.ndarray, move_timer: np.ndarray,
               interval: np.ndarray, count: np.ndarray, terminal: np.ndarray, shown: np.ndarray) -> None:
        """The aliens of lanes[at] move (direction, move_timer, terminal and shown updated in place):
        down a row where they turn at an edge (np.roll(1, axis=0), the bottom row to the top), else a
        column along, as a roll of the flat map that moves no alien across a row's end (none is at
        the edge it moves towards, or they would have turned)."""
        m = lanes[at]
        group = self._aliens[m]
        move_timer[at] = np.minimum(count[at], interval[at])
        columns = group.any(axis=1)
        turn = (columns[:, 0] & (direction[at] < 0)) | (columns[:, 9] & (direction[at] > 0))
        direction[at] = np.where(turn, -direction[at], direction[at])
        terminal[at] |= turn & group[:, 9, :].any(axis=1)
        shift = np.where(turn, 10, direction[at])
        moved = group.reshape(len(m), 100)[np.arange(len(m))[:, None], (_CELLS[None, :] - shift[:, None]) % 100]
        self._aliens[m] = moved = moved.reshape(len(m), 10, 10)
        terminal[at] |= moved[np.arange(len(m)), 9, pos[at]]
        shown[at] = True

    def _shoot(self, lanes: np.ndarray, pos: np.ndarray) -> None:
        """An alien of each lane shoots: the lowest in the column nearest the cannon (the lower one on
        a tie) that holds an alien, MinAtar's stable sort of the columns by distance; the wave is
        never empty here (refilled when cleared)."""
        group = self._aliens[lanes]
        key = np.abs(_COLUMNS[None, :] - pos[:, None]) * 10 + _COLUMNS[None, :]
        column = np.argmin(np.where(group.any(axis=1), key, 1000), axis=1)
        row = 9 - np.argmax(group[np.arange(len(lanes)), ::-1, column], axis=1)
        self.obs[lanes, row, column, 5] = 1

    def _hits(self, lanes: np.ndarray, ours: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """An alien and a bullet of the cannon's in one cell: both gone, a point each. Returns the
        rewards and the aliens left."""
        aliens, obs = self._aliens, self.obs
        at, cell = np.divmod(np.flatnonzero(ours), 100)
        hit = aliens.reshape(len(aliens), 100)[lanes[at], cell]
        if not np.count_nonzero(hit):
            return np.zeros(len(lanes)), count
        at, cell = at[hit], cell[hit]
        row, column = np.divmod(cell, 10)
        aliens[lanes[at], row, column] = False
        ours[at, row, column] = False
        obs[lanes[at], row, column, 1:5] = 0
        kills = np.bincount(at, minlength=len(lanes))
        return kills.astype(np.float64), count - kills

    def _show_aliens(self, lanes: np.ndarray, direction: np.ndarray) -> None:
        """The lanes' alien channels from their maps: every alien, and each under its direction."""
        self.obs[lanes, :, :, 1:4] = self._aliens[lanes][..., None] * _SHOWN[(direction < 0).astype(np.intp)][:, None, None, :]

    def close(self) -> None:
        pass


def make_lanes(env: Any, width: int) -> Lanes:
    """`width` lanes for the recipe's env section: numpy lanes (BreakoutLanes, SpaceInvadersLanes)
    where its environment is that MinAtar game exactly as they compute it, else GymLanes."""
    probe = make_env_from(env, whole_games=True)
    try:
        settings = _minatar_settings(probe)
    finally:
        probe.close()
    if settings is None:
        return GymLanes(env, width)
    game, action_set, sticky, max_steps, ramping = settings
    if game == "breakout":
        return BreakoutLanes(width, action_set, sticky, max_steps)
    return SpaceInvadersLanes(width, action_set, sticky, max_steps, ramping)


_NUMPY_GAMES = {"breakout": BREAKOUT_CHECKED_MINATAR, "space_invaders": SPACE_INVADERS_CHECKED_MINATAR}
"""MinAtar games with numpy lanes, and the MinAtar versions each was checked against."""


def _minatar_settings(env: gym.Env) -> tuple[str, list[int], float, int | None, bool] | None:
    """(game, action set, sticky-action probability, step limit, difficulty ramping) of an
    environment that is a MinAtar game with numpy lanes behind the wrappers make_env gives it and
    nothing else, at a MinAtar version its lanes were checked against; None for any other."""
    max_steps, layer = None, env
    if not isinstance(layer, BoolToUint8):
        return None
    layer = layer.env
    if isinstance(layer, gym.wrappers.TimeLimit):
        max_steps, layer = layer._max_episode_steps, layer.env
    while isinstance(layer, (gym.wrappers.OrderEnforcing, gym.wrappers.PassiveEnvChecker)):
        layer = layer.env  # checks of a caller's call order and of the first step's types: nothing to compute
    game = getattr(layer, "game", None)
    if (type(layer).__module__, type(layer).__name__) != ("minatar.gym", "BaseEnv") or layer.render_mode is not None:
        return None
    if (type(game).__module__, type(game).__name__) != ("minatar.environment", "Environment"):
        return None
    module = type(getattr(game, "env", None)).__module__
    name = module.rpartition(".")[2]
    if module != f"minatar.environments.{name}" or _minatar_version() not in _NUMPY_GAMES.get(name, ()):
        return None
    return name, list(layer.action_set), float(game.sticky_action_prob), max_steps, bool(getattr(game.env, "ramping", True))


@lru_cache(maxsize=1)
def _minatar_version() -> str | None:
    try:
        return metadata.version("minatar")
    except metadata.PackageNotFoundError:
        return None
