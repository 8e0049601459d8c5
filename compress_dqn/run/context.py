"""What every stage of one seed's run reads (RunContext), the stage frame, and opening a run."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import numpy as np
from pydantic import BaseModel

from compress_dqn._tf import configure_device, configure_threads, tf_keras
from compress_dqn.deploy.litert.policy import TFLitePolicy
from compress_dqn.envs.environment import EnvInfo, probe_env
from compress_dqn.errors import UserError
from compress_dqn.evaluation.diagnosis import action_gaps
from compress_dqn.evaluation.ranges import EvalRanges
from compress_dqn.fileio import load_dict
from compress_dqn.port.run_dir import baseline_network
from compress_dqn.recipe.schema import Recipe
from compress_dqn.run import resources
from compress_dqn.run.rundir import prepare_run_dir
from compress_dqn.store.layout import BASELINE, RunLayout
from compress_dqn.store.stages import Stages


def decisive_states(q_values: np.ndarray) -> np.ndarray:
    """Held-out states where the baseline prefers its action clearly: its gap between the best and
    second-best Q-value is at least the median gap. Where actions are near-tied (a balanced pole, a
    landed lander) any rounding flips the argmax at no cost in return, so agreement there says
    little; agreement on these states says whether the variant keeps the baseline's decisions."""
    gap = action_gaps(q_values)
    return gap >= np.median(gap)


@dataclass
class RunContext:
    """What every stage of one seed's run reads: the recipe, the probed environment, the run
    directory's layout and its finished stages. Heavy objects (the baseline network, held-out states)
    are loaded from the run directory on first use, so any stage can run alone in a fresh process."""

    recipe: Recipe
    run_dir: Path
    info: EnvInfo
    stages: Stages
    log: Callable[[str], None] = print
    quiet: bool = False
    device: str = "cpu"

    @cached_property
    def layout(self) -> RunLayout:
        return RunLayout(self.run_dir)

    @cached_property
    def ranges(self) -> EvalRanges:
        """The episode seeds every stage of this run plays."""
        return EvalRanges.of(self.recipe.eval)

    @cached_property
    def model(self) -> tf_keras.Model:
        """The baseline Q-network (tf_keras), with its trained weights."""
        return baseline_network(self.layout, self.recipe, self.info)

    @cached_property
    def heldout(self) -> np.ndarray:
        """States from the held-out episodes (action agreement and latency are measured on them)."""
        return load_dict(self.layout.heldout)["observations"]

    @cached_property
    def reference(self) -> tuple[np.ndarray, np.ndarray]:
        """The baseline TFLite policy's actions on the held-out states, and which states are decisive."""
        policy = TFLitePolicy(self.layout.policy(BASELINE).tflite)
        return policy.actions(self.heldout), decisive_states(policy.q_values(self.heldout))


@dataclass(frozen=True)
class Stage:
    """A named step of a run: a function of the run's context returning what stages.json keeps."""

    name: str
    run: Callable[[RunContext], BaseModel]


def run_stages(ctx: RunContext, stages: list[Stage]) -> None:
    """Run each stage not finished yet, recording its outputs as soon as it ends (the resume point)."""
    for stage in stages:
        if stage.name not in ctx.stages.done:
            ctx.stages.finish(stage.name, stage.run(ctx))


def open_run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> tuple[RunContext, bool]:
    """Check the environment and the resources, then create or reopen run_dir. Returns (context, resumed).

    The environment is probed before anything is written: a bad id leaves no run directory behind.
    It sets the recipe's TensorFlow thread count first, as reopen_run does: a run whose baseline is
    already trained builds its variants here, and left at TensorFlow's default they would be built
    on other thread pools, so other bytes, than the same variants built in a unit.
    """
    configure_threads(recipe.train.intra_op_threads)
    run_dir = Path(run_dir)
    info = probe_env(recipe.env)
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"{run_dir}: is a file, not a run directory; pass another --out")
    if "train" not in Stages(run_dir).done:
        resources.check(resources.plan(recipe, info), run_dir)
    device = configure_device(recipe.device)  # a device that is not there: refused before anything is written
    resumed = prepare_run_dir(recipe, run_dir, log)
    stages = Stages(run_dir)  # as prepared: a rerun may have dropped variants' stages
    if resumed and (forgotten := stages.forget_missing()):
        log(f"{run_dir}: files of {len(forgotten)} finished stage(s) are missing ({', '.join(forgotten[:3])}"
            f"{', ...' if len(forgotten) > 3 else ''}); redoing them")
    return RunContext(recipe, run_dir, info, stages, log, quiet, device), resumed


def reopen_run(recipe: Recipe, run_dir: Path, quiet: bool = False, log: Callable[[str], None] = print) -> RunContext:
    """The context of a run directory that open_run prepared (for a unit that runs one of its stages).

    It sets the recipe's TensorFlow thread count first, as a unit's first TensorFlow call must: left
    at TensorFlow's default (a thread per core for each op pool), two units side by side on 2 cores
    oversubscribe them and every build slows down."""
    configure_threads(recipe.train.intra_op_threads)
    run_dir = Path(run_dir)
    return RunContext(recipe, run_dir, probe_env(recipe.env), Stages(run_dir), log, quiet, configure_device(recipe.device))
