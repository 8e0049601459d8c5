"""Which episode seeds each evaluation plays, derived in one place from the recipe's eval block.

Every policy plays episode i on seed `seed + i`, so verdicts are paired; the sequential looks
extend that range (episodes, doubling, up to max_episodes); the held-out episodes, whose states
measure action agreement, play seeds that no evaluation touches. Stages ask this object for their
seeds instead of adding recipe fields themselves; the ranges themselves are the recipe's
(EvalConfig.seed_range and heldout_range, recipe.seed_range.SeedRange), which its overlap checks use.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress_dqn.evaluation.verdicts import sequential_plan
from compress_dqn.recipe.schema import EvalConfig, SeedRange


@dataclass(frozen=True)
class EvalRanges:
    """The seeds of a run's evaluation episodes, its looks and its held-out episodes."""

    episodes: int
    max_episodes: int | None
    evaluation: SeedRange
    """Every look's episodes (EvalConfig.seed_range)."""
    heldout_range: SeedRange
    """The held-out episodes (EvalConfig.heldout_range)."""

    @classmethod
    def of(cls, cfg: EvalConfig) -> EvalRanges:
        return cls(cfg.episodes, cfg.max_episodes, cfg.seed_range, cfg.heldout_range)

    @property
    def seed(self) -> int:
        """The first evaluation seed."""
        return self.evaluation.start

    @property
    def heldout_seed(self) -> int:
        return self.heldout_range.start

    @property
    def heldout_episodes(self) -> int:
        return len(self.heldout_range)

    @property
    def first(self) -> range:
        """The seeds every policy plays first (the evaluate and random stages, each variant's build)."""
        return self.episode_seeds(0, self.episodes)

    def episode_seeds(self, start: int, end: int) -> range:
        """The seeds of episodes start..end-1 of the paired sequence (a look plays more of it)."""
        return range(self.seed + start, self.seed + end)

    @property
    def looks(self) -> list[int]:
        """Episode counts at which an open verdict is looked at again: episodes, doubling, max_episodes."""
        return sequential_plan(self.episodes, self.max_episodes)[0]

    @property
    def confidence(self) -> float:
        """Each look's CI level, so that all the looks together keep a 5% error rate."""
        return sequential_plan(self.episodes, self.max_episodes)[1]

    @property
    def heldout(self) -> range:
        """The held-out episodes' seeds (action agreement; no calibration, fine-tune or verdict plays them)."""
        return self.heldout_range.seeds
