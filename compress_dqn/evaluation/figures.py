"""Typed measurement blocks of results.json: returns, sizes, latency, memory, microcontroller figures (TFLite Micro's
and the generated C policy's), comparisons.

Each block is a pydantic record whose JSON keys are results.json's (field aliases where a key is no
Python name, such as `return`): the stored legacy files load into them and save back unchanged, and
unknown keys are ignored (keys fixed by tests/test_legacy_files.py). This module never imports TensorFlow.
"""

from __future__ import annotations

from enum import Enum
from typing import ClassVar

from pydantic import (BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, field_validator,
                      model_serializer)

# results.json's micro and c_policy blocks, re-exported from where they are measured
from compress_dqn.deploy.micro_figures import C_TARGETS as C_TARGETS
from compress_dqn.deploy.micro_figures import M0PLUS as M0PLUS
from compress_dqn.deploy.micro_figures import M4F as M4F
from compress_dqn.deploy.micro_figures import CFigures as CFigures
from compress_dqn.deploy.micro_figures import FlashEstimate as FlashEstimate
from compress_dqn.deploy.micro_figures import MicroFigures as MicroFigures


class Record(BaseModel):
    """A block of results.json. `omit_unset` fields are left out of the JSON when a writer never set
    them (a key today's writer adds only sometimes); `omit_none` fields when they are None."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")
    omit_unset: ClassVar[frozenset[str]] = frozenset()
    omit_none: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> object:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        for name, spec in type(self).model_fields.items():
            key = spec.alias if info.by_alias and spec.alias else name
            if (name in self.omit_unset and name not in self.model_fields_set) or (
                    name in self.omit_none and getattr(self, name) is None):
                data.pop(key, None)
        return data

    def to_dict(self) -> dict:
        """The block as results.json holds it."""
        return self.model_dump(mode="json", by_alias=True)


class OpenRecord(Record):
    """A block that keeps keys it does not name (a recipe's own fields, which grow with it); with
    `extras_first` they are written before the named ones, as the writer orders them."""

    model_config = ConfigDict(populate_by_name=True, extra="allow")
    extras_first: ClassVar[bool] = False

    @model_serializer(mode="wrap")
    def _leave_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> object:
        data = Record._leave_out(self, handler, info)
        extra = self.model_extra or {}
        if not self.extras_first or not isinstance(data, dict):
            return data
        return {**{k: data[k] for k in extra if k in data}, **{k: v for k, v in data.items() if k not in extra}}


class Verdict(str, Enum):
    """A variant's return against the baseline's, from the paired difference's CI.

    results.json keeps the label (`label`): "within 1%" names its tolerance, so the kind is
    read back with `Verdict.of`, never by comparing text.
    """

    BETTER = "better"
    WITHIN = "within"
    WORSE = "worse"
    INCONCLUSIVE = "inconclusive"
    REFERENCE = "reference"

    @classmethod
    def of(cls, label: str | None) -> Verdict | None:
        """The kind of a stored label ("within 1%" -> WITHIN); None for None or a label it does not know."""
        if label is None:
            return None
        head = label.split(" ", 1)[0]
        return cls(head) if head in cls._value2member_map_ else None

    def label(self, tolerance: float) -> str:
        return f"within {100 * tolerance:g}%" if self is Verdict.WITHIN else self.value

    @property
    def keeps_return(self) -> bool:
        """Within tolerance or better: the variant keeps the baseline's return."""
        return self in (Verdict.BETTER, Verdict.WITHIN)


def keeps_return(verdict: str | Verdict | None) -> bool:
    """Whether a verdict (or its stored label) says the variant keeps the baseline's return."""
    kind = verdict if isinstance(verdict, Verdict) else Verdict.of(verdict)
    return kind is not None and kind.keeps_return


class ReturnStats(Record):
    """Per-episode returns and their summary (the `return` block)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    mean: float
    std: float
    ci95: tuple[float, float]
    episodes: list[float]


class SizeStats(Record):
    """The `size` block: parameters and the bytes of each artifact."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    params: int
    nonzero_params: int
    tflite_bytes: int
    tflite_gzip_bytes: int
    saved_model_bytes: int


class LatencyStats(Record):
    """Batch-1 action latency in microseconds, and batch-256 throughput."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)
    p50: float
    p99: float
    mean: float
    calls: int
    batch256_obs_per_s: float


class MemoryProbe(Record):
    """What one memory probe process printed: its runtime's peak RSS acting with one policy."""

    runtime: str
    steps: int
    process_baseline_rss: int
    peak_rss: int
    policy_rss: int
    imports_tensorflow: bool


class CpuLatency(Record):
    """Batch-1 latency per CPU runtime."""

    tflite: LatencyStats | None = None
    saved_model: LatencyStats | None = None


class GpuLatency(Record):
    """The SavedModel's latency on the first GPU."""

    saved_model: LatencyStats


class LatencyBlock(Record):
    """A policy's `latency_us` block; gpu is None where no GPU is visible (results.json's `gpu` says why)."""

    cpu: CpuLatency = Field(default_factory=CpuLatency)
    gpu: GpuLatency | None = None


class CpuMemory(Record):
    """Peak RSS per runtime; the SavedModel's is None where it was not probed (measure.saved_model_memory)."""

    tflite: MemoryProbe | None = None
    saved_model: MemoryProbe | None = None


class MemoryBlock(Record):
    """A policy's `memory_bytes` block."""

    cpu_rss: CpuMemory = Field(default_factory=CpuMemory)
    gpu_peak: int | None = None


class CandidatesPick(OpenRecord):
    """A variant built as the best of several builds: the recipe's candidates block, which build was
    kept and each build's paired difference on fresh episodes."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"builds", "qat_teachers"})
    count: int
    episodes: int
    seed: int
    picked: int
    fresh_differences: list[float]
    builds: list[str] | None = None
    """Each difference's build (NAME.cK, and .TEACHER where qat_teachers made several of one
    build); absent in records written before it was kept."""
    qat_teachers: list[str] | None = None


class Compression(OpenRecord):
    """A variant's `compression` block: its recipe fields (kept as written: quantize, student,
    prune, fine_tune, ...) and build details, with the pick of its candidates where it had them."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"candidates", "tflite_sparse_format", "build_seconds"})
    extras_first: ClassVar[bool] = True
    candidates: CandidatesPick | None = None
    tflite_sparse_format: bool | None = None
    build_seconds: float | None = None


ONE_PERCENT = 0.01
"""The tolerance every verdict is also reported at when a run decides at a wider one."""


class AtOnePercent(Record):
    """A verdict at a wider tolerance, restated at 1% of the baseline's lead on the same paired episodes
    (the same CI against a margin of 1%): what the report gives beside a run decided at, say, 5%."""

    verdict: str
    """The label at 1% ("within 1%", "inconclusive", ...); `kind` is the Verdict."""
    margin: float
    episodes_to_decide: int | None = None
    """Where the 1% verdict is inconclusive: about how many paired episodes would decide it (None where none can say)."""

    @property
    def kind(self) -> Verdict | None:
        return Verdict.of(self.verdict)


class Comparison(Record):
    """A variant's paired comparison with the baseline (verdicts.paired_difference). The JSON keeps
    the verdict's label ("within 1%") under `verdict`; the record holds the kind."""

    omit_unset: ClassVar[frozenset[str]] = frozenset(
        {"unseen_loss", "episodes_differing", "episodes_to_decide", "random_mean", "normalized_score"})
    omit_none: ClassVar[frozenset[str]] = frozenset({"at_one_percent"})
    mean: float
    ci: tuple[float, float]
    confidence: float
    verdict: Verdict
    tolerance: float
    margin: float
    episodes: int
    unseen_loss: float | None = None
    episodes_differing: int | None = None
    episodes_to_decide: int | None = None
    """Set for an inconclusive verdict: about how many paired episodes would decide it (None where none can say)."""
    random_mean: float | None = None
    normalized_score: float | None = None
    at_one_percent: AtOnePercent | None = None
    """Set where `tolerance` is wider than 1%: the verdict at 1% on the same episodes (None otherwise)."""

    @field_validator("verdict", mode="before")
    @classmethod
    def _kind(cls, value: object) -> object:
        if isinstance(value, str) and not isinstance(value, Verdict):
            kind = Verdict.of(value)
            if kind is None:
                raise ValueError(f"unknown verdict {value!r}")
            return kind
        return value

    @model_serializer(mode="wrap")
    def _leave_out(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> object:
        data = Record._leave_out(self, handler, info)
        if isinstance(data, dict):
            data["verdict"] = self.label
        return data

    @property
    def label(self) -> str:
        """The verdict as results.json and the report write it ("within 1%")."""
        return self.verdict.label(self.tolerance)
