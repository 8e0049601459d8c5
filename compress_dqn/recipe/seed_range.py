"""A range of episode seeds, [start, end): the one place that says when two ranges share a seed.

Every policy plays episode i on seed `first + i`, so each block of the recipe that plays episodes
(the evaluation and its looks, the held-out episodes, model selection, a candidates' pick) owns
such a range; the recipe refuses two that overlap, and the evaluation stages ask for their seeds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeedRange:
    """Seeds start .. end-1."""

    start: int
    end: int

    @classmethod
    def of(cls, first: int, count: int) -> SeedRange:
        """`count` episodes from seed `first`."""
        return cls(first, first + count)

    @property
    def last(self) -> int:
        return self.end - 1

    @property
    def seeds(self) -> range:
        return range(self.start, self.end)

    def __len__(self) -> int:
        return max(self.end - self.start, 0)

    def overlaps(self, other: SeedRange) -> bool:
        """Whether some seed is in both."""
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{self.start}, {self.end})"
