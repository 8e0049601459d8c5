"""Names of a run's stages in stages.json, built and read in one place.

A stage key is text in stages.json ("variant:NAME", "look:200:NAME"), so that a run directory
stays readable and resumable by hand; code builds keys with these functions and reads them back
with `StageKey.parse`, never with f-strings or split(":") of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

PER_POLICY_KINDS = ("variant", "measure", "memory", "look")
"""Stages of one policy, which a rebuilt variant must redo."""


@dataclass(frozen=True)
class StageKey:
    """A parsed stage key: its kind, the policy it belongs to, and the look (episode count) it ends at."""

    kind: str
    name: str | None = None
    look: int | None = None

    def __str__(self) -> str:
        return ":".join(str(part) for part in (self.kind, self.look, self.name) if part is not None)

    @classmethod
    def parse(cls, text: str) -> StageKey:
        """The parts of a key; ValueError for text no stage key has (a hand-edited stages.json)."""
        kind, _, rest = text.partition(":")
        if kind == "reference":
            return cls(kind, look=int(rest))
        if kind == "look":
            look, _, name = rest.partition(":")
            return cls(kind, name, int(look))
        return cls(kind, rest or None)


def variant(name: str) -> str:
    """The build-export-evaluate stage of variant `name`."""
    return str(StageKey("variant", name))


def measure(name: str) -> str:
    """Latency, GPU and microcontroller figures of policy `name` (the baseline or a variant)."""
    return str(StageKey("measure", name))


def memory(name: str) -> str:
    """The inference-memory probe of policy `name`."""
    return str(StageKey("memory", name))


def look(after: int, name: str) -> str:
    """Variant `name`'s episodes of the sequential look that ends at `after` episodes."""
    return str(StageKey("look", name, after))


def reference(after: int) -> str:
    """The baseline's and the random policy's episodes of the look that ends at `after`."""
    return str(StageKey("reference", look=after))
