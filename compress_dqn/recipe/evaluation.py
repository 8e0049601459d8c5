"""The recipe's eval and measure blocks: which episodes every policy plays, the verdict's margin, what is measured.

The evaluation's seed ranges (every look's episodes, the held-out ones) are derived here, as
SeedRanges, for the recipe's overlap checks and for the evaluation stages (evaluation/ranges.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from compress_dqn.recipe.seed_range import SeedRange
from compress_dqn.recipe.values import Count, PositiveCount, StrictModel, real_between


class EvalConfig(StrictModel):
    """Final evaluation: greedy episodes on fixed seeds, shared by every variant."""

    episodes: PositiveCount = 100
    """Episodes every variant plays first, on seeds seed .. seed+episodes-1."""
    seed: Count = 0
    """First episode seed."""
    max_episodes: PositiveCount | None = None
    """Sequential evaluation: while a variant's verdict is inconclusive, double its episodes (and
    the baseline's and the random policy's) up to this many; each look's CI is widened to
    1 - 0.05/looks so the repeated looks keep a 5% error rate overall. null: episodes only."""
    tolerance: real_between(0.0, 1.0, lo_open=True) = 0.01
    """Non-inferiority margin, as a share of the baseline's lead over a uniform-random policy on
    the same episodes: 0.01 means "keeps 99% of what the baseline adds over random"."""
    heldout_seed: Count = 1_000_000
    """First seed of the episodes whose states measure action agreement; no calibration, fine-tune
    or return evaluation plays them."""
    heldout_episodes: PositiveCount = 10
    """Baseline episodes (greedy) whose visited states measure action agreement."""

    @property
    def seed_range(self) -> SeedRange:
        """The seeds every look plays: seed .. seed + max(episodes, max_episodes) - 1."""
        return SeedRange.of(self.seed, max(self.episodes, self.max_episodes or 0))

    @property
    def heldout_range(self) -> SeedRange:
        """The held-out episodes' seeds (action agreement)."""
        return SeedRange.of(self.heldout_seed, self.heldout_episodes)

    @model_validator(mode="after")
    def _cap(self) -> EvalConfig:
        if self.max_episodes is not None and self.max_episodes < self.episodes:
            raise ValueError(f"max_episodes {self.max_episodes} is below episodes {self.episodes}; raise it or drop it")
        seeds = self.seed_range
        if self.heldout_range.overlaps(seeds):
            raise ValueError(f"heldout_seed {self.heldout_seed} overlaps the evaluation seeds {seeds.start}..{seeds.last}; "
                             "move one of them")
        return self


class MeasureConfig(StrictModel):
    """What the measuring stage probes besides size and latency."""

    saved_model_memory: Literal["all", "baseline", "none"] = "all"
    """Whose SavedModel inference memory is probed: every policy's, the baseline's only, or none
    (smoke runs and tests that read no memory figure). Each probe is a fresh process that imports
    TensorFlow, and TensorFlow's runtime is most of the figure and much the same for every policy,
    so "baseline" spares a quick run those imports and still shows what serving through TensorFlow
    takes (docs/measurements.md). Every policy's TFLite memory is probed either way."""
    c_policy: Literal["all", "none"] = "all"
    """Whether each policy's flash and RAM as generated C are measured (where the `c` extra is installed):
    "none" still translates the policy (results.json says whether it translates and is integer-only) but
    cross-compiles nothing; for smoke runs and tests that read no C figure, as a large CNN's C source
    takes seconds per target to compile."""
    micro: Literal["all", "none"] = "all"
    """Whether each policy's TensorFlow Lite Micro arena is measured (where the `micro` extra is installed):
    "none" records the model's flash only, with the reason; for smoke runs and tests that read no MCU figure
    (measuring runs the policy in TFLM at shrinking arena sizes, a fraction of a second per policy)."""
