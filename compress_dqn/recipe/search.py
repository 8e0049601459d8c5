"""The recipe's search block: the students, shrunk networks, sparsities and quantized baseline it tries, and its budget."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from compress_dqn.recipe.old_search_keys import templates_from_old_keys
from compress_dqn.recipe.techniques import StudentConfig
from compress_dqn.recipe.templates import PrunedTemplate, StudentTemplate, VariantTemplate
from compress_dqn.recipe.values import PositiveCount, StrictModel, count_from, real_between


class SearchConfig(StrictModel):
    """Find the smallest policy that keeps the baseline's return on every training seed.

    Each family is a ladder of candidates ordered by size: the students, the baseline pruned to
    each sparsity, and the quantized baseline (one rung). A family's rungs are one variant
    template (student, pruned, quantized_baseline) with what the ladder varies, each named for its
    settings (student-32x32-qat-int8, prune-90-int8, qat-int8). The search bisects each ladder for
    its smallest rung within eval.tolerance (assuming a smaller rung never keeps more return), and
    skips a rung that cannot beat the best policy found so far. The earlier keys (student_quantize,
    prune_fine_tune, qat_steps, ...) are still read, into the templates (old_search_keys.py)."""

    objective: Literal["gzip_bytes", "params", "latency"] = "gzip_bytes"
    """What "smallest" means: the gzipped .tflite bytes, the nonzero parameters, or the TFLite
    batch-1 p50 latency on this machine."""
    students: list[list[PositiveCount] | StudentConfig] = Field(
        default_factory=lambda: [[64, 64], [48, 48], [32, 32], [16, 16], [8, 8]])
    """Students to try (distilled from the baseline): hidden widths, an MLP on the flattened
    observation ([32, 32]), or a network with conv layers for images ({conv: [{filters: 8,
    kernel: 3}], net_arch: [32]}); [] leaves students out."""
    student: StudentTemplate = Field(default_factory=StudentTemplate)
    """How every student is built: a variant less its name and network (fine_tune, quantize,
    cluster, candidates)."""
    sparsities: list[real_between(0.0, 1.0, lo_open=True, hi_open=True)] = Field(default_factory=list)
    """Magnitude-pruning targets to try on the baseline; [] leaves pruning out."""
    shrunk: list[list[PositiveCount] | StudentConfig] = Field(default_factory=list)
    """The baseline narrowed to each shape (structured pruning): it keeps its best-ranked filters and
    units with their weights (a student's from_teacher, gap unless an entry names another), then is
    built as `student:` says. Widths for an MLP baseline ([64, 64]); for a CNN, its conv layers with
    fewer filters ({conv: [{filters: 8, kernel: 3}], net_arch: [32]}); [] leaves it out."""
    pruned: PrunedTemplate = Field(default_factory=PrunedTemplate)
    """How every pruned rung is built: a variant less its name and sparsity (prune, fine_tune, quantize)."""
    quantized_baseline: VariantTemplate | None = None
    """The whole baseline quantized, a one-rung family: {quantize: {mode: int8}} (ptq-int8) or
    {quantize: {mode: qat, ...}, fine_tune: {...}} (qat-int8); null: none. Where no student or
    pruning keeps the return (MinAtar Breakout, docs/minatar.md), it is the smallest policy that
    does; where one does, it is skipped unplayed, being larger."""
    max_candidates: count_from(1) | None = None
    """Budget: candidates evaluated at most (each on every seed); null: no limit."""
    max_seconds: real_between(0.0, None, lo_open=True) | None = None
    """Budget: no new candidate starts after this many seconds of search; null: no limit."""

    @model_validator(mode="before")
    @classmethod
    def _old_keys(cls, data: Any) -> Any:
        return templates_from_old_keys(data)

    @model_validator(mode="after")
    def _something_to_try(self) -> SearchConfig:
        if not self.students and not self.shrunk and not self.sparsities and self.quantized_baseline is None:
            raise ValueError("search: give students, shrunk, sparsities or quantized_baseline; nothing to try")
        for key in ("students", "shrunk"):
            if any(not (s.net_arch if isinstance(s, StudentConfig) else s) for s in getattr(self, key)):
                raise ValueError(f"search.{key}: each entry is a list of hidden widths, e.g. [32, 32], or "
                                 "{conv: [...], net_arch: [...]} with at least one hidden width")
        return self

    def templates(self) -> dict[str, VariantTemplate]:
        """Each family's template, by the recipe's key."""
        found = {"student": self.student, "pruned": self.pruned, "quantized_baseline": self.quantized_baseline}
        return {key: template for key, template in found.items() if template is not None}
