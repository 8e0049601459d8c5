"""The search's families as variant templates: a variant less its name, which each rung completes.

A rung is its family's template with what the ladder varies (a student, a prune target), named
for its settings (run.ladders.variant_name). The templates' defaults are the search's.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, ValidationError, model_validator

from compress_dqn.recipe import layer_names
from compress_dqn.recipe.quantize import LOW_BIT_WITHOUT_CLUSTERING, QuantizeConfig
from compress_dqn.recipe.techniques import CandidatesConfig, ClusterConfig, FineTuneConfig, PruneSettings, StudentConfig
from compress_dqn.recipe.validation_errors import format_validation_error
from compress_dqn.recipe.values import StrictModel, count_from
from compress_dqn.recipe.variant import VariantConfig


def _tuning(steps: int, learning_rate: float) -> Any:
    return Field(default_factory=lambda: FineTuneConfig(steps=steps, learning_rate=learning_rate))


class VariantTemplate(StrictModel):
    """A variant less its name: the settings every rung of a search family shares. Each rung is
    this variant with what its family varies, named for its settings (run.ladders.variant_name). A
    key given replaces that key's default whole."""

    FAMILY_KEYS: ClassVar[tuple[str, ...]] = ()
    """Keys of how a family plays its rungs, not of the variant a rung is."""

    fine_tune: FineTuneConfig | None = None
    quantize: QuantizeConfig | None = None
    cluster: ClusterConfig | None = None
    candidates: CandidatesConfig | None = None
    """Build each rung several times and keep the best on fresh episodes (as a variant's candidates)."""

    def variant(self, **varied: Any) -> VariantConfig:
        """The variant a rung is: these settings and what it varies (a student, a prune target), unnamed."""
        try:
            return VariantConfig.model_validate({**self.model_dump(exclude=set(self.FAMILY_KEYS)), "name": "rung", **varied})
        except ValidationError as exc:
            raise ValueError(format_validation_error(exc, limit=1)) from None

    def _check(self) -> None:
        self.variant()

    @model_validator(mode="after")
    def _a_variant(self) -> VariantTemplate:
        """A template that cannot make a variant is refused with the recipe, not at its first rung."""
        self._check()
        return self


INTEGER_ACTIVATIONS = ("qat", "int8", "int16x8")
"""The quantization modes that round activations to a fixed integer range: where a student's
`fallback` form is built."""
SEARCH_QAT = {"mode": "qat", "qat_steps": 5_000, "qat_learning_rate": 1e-4}
"""The search's QAT unless told otherwise: a quarter of the students' distillation, at a tenth of its step size."""
PRUNE_DENSE = [layer_names.hidden(0), layer_names.OUTPUT]
"""The pruned family's dense layers unless told: an MLP's small input and output layers."""


class StudentTemplate(VariantTemplate):
    """How each of search.students is built: distilled from the baseline (fine_tune), then quantized."""

    fine_tune: FineTuneConfig | None = _tuning(20_000, 1e-3)
    """The distillation."""
    quantize: QuantizeConfig | None = Field(default_factory=lambda: QuantizeConfig(**SEARCH_QAT))
    """int8 after a quantization-aware fine-tune (its own steps, a smaller step size); null: float students."""

    FAMILY_KEYS: ClassVar[tuple[str, ...]] = ("fallback", "fallback_candidates")

    fallback: QuantizeConfig | None = Field(default_factory=lambda: QuantizeConfig(mode="weight_only"))
    """Where a rung quantized as `quantize` with integer activations (qat, int8, int16x8) loses the
    return or stays undecided, the same student is built again quantized this way before the
    bisection moves on (the same distillation and candidates), and the rung counts as the better of
    the two. By default weight-only int8 (float activations): on the RL Zoo's MountainCar and Acrobot
    agents, students that lost the return or stayed undecided in QAT int8 kept it weight-only (QR-DQN
    MountainCar's 16x16, DQN Acrobot's 64x64: docs/zoo-search.md). A rung whose first form keeps the
    return builds no second one. null: none (every student full-integer, as TFLite Micro needs)."""
    fallback_candidates: count_from(2) = 6
    """Builds the second form picks from (where the template has candidates). More than the first
    form's: a rung gets there at the margin, where the builds' spread decides, and a build without
    QAT costs less. DQN Acrobot's weight-only 48x48 was undecided as the best of 3 and within 1% as
    the best of 6 (docs/zoo-search.md)."""

    def rung(self, student: StudentConfig) -> VariantConfig:
        return self.variant(student=student)

    def fallback_rung(self, student: StudentConfig) -> VariantConfig | None:
        """The student quantized as `fallback`, or None where there is no fallback, where `quantize`
        leaves the activations float (nothing for a second form to undo) or clusters it."""
        if (self.fallback is None or self.quantize is None or self.quantize.mode not in INTEGER_ACTIVATIONS
                or self.cluster is not None):  # clusters survive quantization through their QAT only
            return None
        candidates = self.candidates and self.candidates.model_copy(
            update={"qat_teachers": None, "count": self.fallback_candidates})
        return self.variant(student=student, quantize=self.fallback.model_dump(),
                            candidates=candidates and candidates.model_dump())

    def _check(self) -> None:
        if self.fallback is not None and self.fallback.is_qat:
            raise ValueError("fallback: quantization-aware int8 is what the students are built as first; give a "
                             "post-training mode (weight_only, dynamic, float16) or null")
        qat = self.quantize is not None and self.quantize.is_qat
        if self.cluster is not None and not qat:
            raise ValueError("cluster: clustered students keep their clusters through quantization-aware int8; "
                             "set quantize: {mode: qat} or remove cluster")
        if qat and self.quantize.kernel_bits and self.cluster is not None:
            raise ValueError(f"quantize.kernel_bits: {LOW_BIT_WITHOUT_CLUSTERING}; remove cluster or kernel_bits")
        self.rung(StudentConfig(net_arch=[1]))
        self.fallback_rung(StudentConfig(net_arch=[1]))


class PrunedTemplate(VariantTemplate):
    """How the baseline is pruned to each of search.sparsities, recovered (fine_tune) and quantized."""

    prune: PruneSettings = Field(default_factory=lambda: PruneSettings(exclude=PRUNE_DENSE))
    """Layers kept dense (by default the small input and output layers) and how pruning ramps."""
    fine_tune: FineTuneConfig | None = _tuning(6_000, 3e-4)
    """The recovery fine-tune, during which pruning reaches its target."""
    quantize: QuantizeConfig | None = Field(default_factory=lambda: QuantizeConfig(mode="int8"))
    """Post-training int8. dynamic keeps float activations: on MinAtar Space Invaders int8 activations
    cost the pruned baseline its return and int8 weights alone did not (docs/minatar.md); qat keeps
    the sparsity through quantization-aware int8."""

    def rung(self, sparsity: float) -> VariantConfig:
        return self.variant(prune={**self.prune.model_dump(), "sparsity": sparsity})

    def _check(self) -> None:
        if self.cluster is not None:
            raise ValueError("cluster: a pruned rung is not clustered too; remove cluster (a student may be)")
        self.rung(0.5)
