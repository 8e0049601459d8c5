"""Which episode seeds each evaluation plays, derived in one place from the recipe's eval block.

Every policy plays episode i on seed `seed + i`, so verdicts are paired; the sequential looks
extend that range (episodes, doubling, up to max_episodes); the held-out episodes, whose states
measure action agreement, play seeds that no evaluation touches. Stages ask this object for their
seeds instead of adding recipe fields themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from compress_dqn.evaluation.verdicts import sequential_plan
from compress_dqn.recipe.schema import EvalConfig


@dataclass(frozen=True)
class EvalRanges:
    """The seeds of a run's evaluation episodes, its looks and its held-out episodes."""

    episodes: int
    seed: int
    max_episodes: int | None
    heldout_seed: int
    heldout_episodes: int

    @classmethod
    def of(cls, cfg: EvalConfig) -> EvalRanges:
        return cls(cfg.episodes, cfg.seed, cfg.max_episodes, cfg.heldout_seed, cfg.heldout_episodes)

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
        return range(self.heldout_seed, self.heldout_seed + self.heldout_episodes)
