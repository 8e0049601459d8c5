"""What a run will need in memory and on disk, checked before anything starts.

A run that dies hours in, because the replay buffer outgrew the machine or a checkpoint filled the
disk, costs more than one refused at the start. The replay buffer dominates both: it lives in
memory for the whole run, and each checkpoint writes a copy of it next to the previous one (the
old checkpoint is removed only once the new one is complete), plus the final copy in baseline/;
a fixed margin covers the exports, reports and TensorBoard events (ResourcePlan.disk_parts).
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict

from compress_dqn.envs.environment import EnvInfo, probe_env
from compress_dqn.errors import UserError
from compress_dqn.port.brought_data import brought_replay
from compress_dqn.replay.buffer import ReplayBuffer, format_bytes
from compress_dqn.replay.sizing import replay_capacity, replay_expectation
from compress_dqn.replay.sizing import replay_bytes as replay_bytes_of

# TensorFlow, the environment and the interpreter, on top of the replay buffer and the networks.
_PROCESS_OVERHEAD = 1 << 30
# Headroom on disk for exports, reports, TensorBoard events and the policies.
_DISK_MARGIN = 64 << 20
# Share of available memory a run may plan to use (as the replay buffer's own check).
_MEMORY_SHARE = 0.9


def _fmt(n: float) -> str:
    return format_bytes(n, decimals=1)


@dataclass(frozen=True)
class ResourcePlan:
    """Bytes a run needs, from its recipe and environment, before anything is allocated."""

    replay_capacity: int
    replay_bytes: int
    network_bytes: int
    """Weights of the online and target networks, Adam's two moments and the gradients."""
    memory_bytes: int
    trains: bool = True
    """False for a brought baseline: no checkpoints, its data written once to baseline/."""

    def disk_parts(self) -> list[tuple[str, int]]:
        """What the run writes, as (what, bytes), so a message can say where disk_bytes comes from."""
        if not self.trains:
            return [(f"the brought baseline's data in baseline/ ({_fmt(self.replay_bytes)})", self.replay_bytes),
                    ("exports, reports and TensorBoard", _DISK_MARGIN)]
        return [
            (f"the replay buffer in two checkpoints and baseline/ (3 x {_fmt(self.replay_bytes)})", 3 * self.replay_bytes),
            (f"networks and optimizer state (4 x {_fmt(self.network_bytes)})", 4 * self.network_bytes),
            ("exports, reports and TensorBoard", _DISK_MARGIN),
        ]

    def lower_what(self) -> str:
        """The recipe keys that shrink what this run holds, for a refusal's fix."""
        if self.trains:
            return "lower train.buffer_size or set replay.memory"
        return "lower baseline.rollout.steps (or bring fewer transitions)"

    @property
    def disk_bytes(self) -> int:
        """Disk the run needs: the sum of disk_parts."""
        return sum(size for _, size in self.disk_parts())


def _network_params(recipe: Any, info: Any) -> int:
    """Parameters of the recipe's network, counted without building it (no TensorFlow)."""
    shape = list(info.obs_shape)
    params = 0
    if recipe.train.conv and len(shape) != 3:
        raise UserError(f"train.conv: convolutions need image observations (height, width, channels), but "
                        f"{info.env_id} gives {tuple(info.obs_shape)}; remove train.conv (net_arch alone is an MLP)")
    for i, conv in enumerate(recipe.train.conv):
        height = (shape[0] - conv.kernel) // conv.stride + 1
        width = (shape[1] - conv.kernel) // conv.stride + 1
        if height <= 0 or width <= 0:
            raise UserError(f"train.conv.{i}: a {conv.kernel}x{conv.kernel} kernel does not fit its "
                            f"{shape[0]}x{shape[1]} input; use a smaller kernel or stride, or fewer layers")
        params += conv.kernel * conv.kernel * shape[2] * conv.filters + conv.filters
        shape = [height, width, conv.filters]
    width_in = math.prod(shape)
    for width in [*recipe.train.net_arch, info.n_actions]:
        params += width_in * width + width
        width_in = width
    return params


def plan(recipe: Any, info: Any) -> ResourcePlan:
    """Memory and disk a run of this recipe needs (see the module docstring for the model)."""
    capacity = replay_capacity(recipe.train, recipe.replay, info)
    network_bytes = 5 * 4 * _network_params(recipe, info)  # online, target, 2 Adam moments, gradients
    if recipe.baseline is not None:  # nothing trains: the buffer holds the brought data, uncompressed
        row = ReplayBuffer.bytes_per_row(info.obs_shape, info.obs_dtype, info.n_actions, frame_stack=info.frame_stack)
        capacity, replay_bytes = brought_replay(recipe.baseline, capacity, info.frame_stack, row)
    else:
        replay_bytes = replay_bytes_of(recipe.train, recipe.replay, info)  # compressed: its byte bound
    return ResourcePlan(
        replay_capacity=capacity,
        replay_bytes=replay_bytes,
        network_bytes=network_bytes,
        memory_bytes=replay_bytes + network_bytes + _PROCESS_OVERHEAD,
        trains=recipe.baseline is None,
    )


def _existing_parent(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def bytes_under(path: Path) -> int:
    """Bytes of the files under path (0 if it does not exist)."""
    path = Path(path)
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else 0


def fits_at_once(needed: ResourcePlan, wanted: int) -> int:
    """How many of `wanted` processes that each need `needed.memory_bytes` fit in available memory
    at once (at least 1: a single one is checked, with its message, by check)."""
    available = _MEMORY_SHARE * psutil.virtual_memory().available
    return max(1, min(wanted, int(available // max(1, needed.memory_bytes))))


def check(needed: ResourcePlan, run_dir: Path, at_once: int = 1, in_total: int = 1) -> None:
    """Refuse a run that would not fit in available memory or on run_dir's disk, with the numbers.

    at_once: runs that hold memory at the same time (parallel seeds); in_total: runs that write
    to run_dir (all seeds). Bytes a resumed run already wrote count as free: they get rewritten.
    """
    memory = needed.memory_bytes * at_once
    available = psutil.virtual_memory().available
    if memory > _MEMORY_SHARE * available:
        parts = (f"replay {_fmt(needed.replay_bytes)} for {needed.replay_capacity} transitions + networks "
                 f"{_fmt(needed.network_bytes)} + process ~{_fmt(_PROCESS_OVERHEAD)}")
        raise UserError(
            f"this run needs about {_fmt(memory)} of memory ({_times(at_once, 'runs at once', parts)}) but {_fmt(available)} "
            f"is available; {needed.lower_what()}" + (", or lower workers" if at_once > 1 else "")
        )
    disk = needed.disk_bytes * in_total
    free = shutil.disk_usage(_existing_parent(run_dir)).free + bytes_under(run_dir)
    if disk > free:
        parts = " + ".join(f"{_fmt(size)} for {what}" for what, size in
                           sorted(needed.disk_parts(), key=lambda part: -part[1]))
        raise UserError(
            f"this run needs about {_fmt(disk)} of disk under {run_dir} ({_times(in_total, 'seeds', parts)}) but "
            f"{_fmt(free)} is free; free space, {needed.lower_what()}, or pass --out on a larger disk"
        )


def _times(n: int, what: str, parts: str) -> str:
    """parts, as n runs' worth where n > 1 ("2 seeds x (a + b)"), so the figures add up to the total."""
    return f"{n} {what} x ({parts})" if n > 1 else parts


class RecipeCheck(BaseModel):
    """What `validate` learns about a recipe without training: its environment, what a run needs,
    what a compressed replay buffer is expected to hold, and why this machine may not fit it."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)
    info: EnvInfo
    needed: ResourcePlan
    replay_expectation: str | None
    machine_problem: str | None
    """resources.check's refusal on this machine, if any: a warning, the recipe itself is valid."""


def check_recipe(recipe: Any, run_dir: Path) -> RecipeCheck:
    """Probe the recipe's environment and plan a run into run_dir (without importing TensorFlow)."""
    info = probe_env(recipe.env)
    needed = plan(recipe, info)
    try:
        check(needed, run_dir)
        problem = None
    except UserError as exc:
        problem = str(exc)
    return RecipeCheck(info=info, needed=needed, replay_expectation=replay_expectation(recipe.train, recipe.replay, info),
                       machine_problem=problem)
