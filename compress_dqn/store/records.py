"""What each stage of a run records in stages.json, as typed records (`Stages.get(key, Record)`).

Each record's JSON keys are stages.json's (aliases where a key is no Python name, such as `return`):
the stored legacy stages.json files read into them and unknown keys are ignored (keys fixed by
tests/test_legacy_files.py).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from compress_dqn.evaluation.figures import (CFigures, Compression, CpuMemory, LatencyBlock, MemoryBlock, MicroFigures,
                                             Record, ReturnStats, SizeStats)
from compress_dqn.evaluation.results import TrainFigures

TrainRecord = TrainFigures
"""stage "train": what training cost, or a brought baseline's source and port check (results.json `train`)."""

__all__ = ["Artifacts", "EvaluateRecord", "ExportRecord", "HeldoutRecord", "LookRecord", "MeasureRecord",
           "MemoryRecord", "RandomRecord", "ReferenceRecord", "TrainRecord", "VariantRecord"]


class Artifacts(Record):
    """A policy's files, relative to the run directory (RunLayout.artifacts)."""

    saved_model: str
    tflite: str


class ExportRecord(Record):
    """stage "export": the baseline's SavedModel and fp32 TFLite file, and their sizes."""

    artifacts: Artifacts
    size: SizeStats


class EvaluateRecord(Record):
    """stage "evaluate": the baseline's TFLite policy on the first evaluation episodes."""

    returns: ReturnStats = Field(alias="return")
    action_agreement: float = 1.0


class RandomRecord(Record):
    """stage "random": a uniform-random policy on the same episodes (the 0% of normalized scores)."""

    returns: ReturnStats = Field(alias="return")


class HeldoutRecord(Record):
    """stage "heldout": the episodes whose visited states (baseline/heldout_obs.npz) measure agreement."""

    episodes: int
    seed: int


class VariantRecord(Record):
    """stage "variant:NAME": one variant built, exported and played on the first evaluation episodes."""

    artifacts: Artifacts
    size: SizeStats
    returns: ReturnStats = Field(alias="return")
    action_agreement: float
    action_agreement_decisive: float | None = None
    compression: Compression


MemoryRecord = CpuMemory
"""stage "memory:NAME": peak RSS per runtime (probed early, beside the builds)."""


class MeasureRecord(Record):
    """stage "measure:NAME": latency, memory, GPU and microcontroller figures of one policy."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"c_policy"})
    latency_us: LatencyBlock
    memory_bytes: MemoryBlock
    micro: MicroFigures
    c_policy: CFigures | None = None
    """The generated C policy's flash and RAM; None where the `c` extra was not installed."""
    gpu_note: str | None = None
    """None where TensorFlow sees a GPU, else why the GPU figures are missing."""


class LookRecord(Record):
    """stage "look:N:NAME": a variant's episodes of the sequential look that ends at N."""

    episodes: list[float]


class ReferenceRecord(Record):
    """stage "reference:N": the baseline's and the random policy's episodes of the look that ends at N."""

    baseline: list[float]
    random: list[float]
