"""One compressed policy in the recipe (variants:): its techniques and the rules on combining them."""

from __future__ import annotations

from pydantic import Field, model_validator

from compress_dqn.recipe.quantize import QuantizeConfig
from compress_dqn.recipe.techniques import CandidatesConfig, ClusterConfig, FineTuneConfig, PruneConfig, StudentConfig
from compress_dqn.recipe.values import Name, StrictModel


class VariantConfig(StrictModel):
    """One compressed policy built from the trained baseline."""

    name: Name = Field(max_length=64)
    """Letters, digits, '.', '_' and '-' (it names a directory inside the run)."""
    prune: PruneConfig | None = None
    quantize: QuantizeConfig | None = None
    cluster: ClusterConfig | None = None
    student: StudentConfig | None = None
    fine_tune: FineTuneConfig | None = None
    candidates: CandidatesConfig | None = None
    """Build it several times and keep the best on fresh episodes (see CandidatesConfig)."""

    @property
    def is_qat(self) -> bool:
        return self.quantize is not None and self.quantize.is_qat

    @model_validator(mode="after")
    def _combinable(self) -> VariantConfig:
        if self.name in ("baseline", "random"):
            raise ValueError(f"name {self.name!r} is reserved (the trained baseline and the uniform-random "
                             "reference are reported under those names); rename the variant")
        if self.prune and self.cluster:
            raise ValueError("prune and cluster in one variant are not supported; make two variants")
        if self.cluster and not self.student and (self.cluster.steps or self.cluster.learning_rate):
            raise ValueError("cluster.steps and cluster.learning_rate tune a student after its distillation; "
                             "a clustered copy of the baseline uses fine_tune.steps and fine_tune.learning_rate")
        if (self.prune or self.cluster or self.student or self.is_qat) and self.fine_tune is None:
            self.fine_tune = FineTuneConfig()
        if self.student:
            self.fine_tune.require_distill("a student learns from the baseline")
        if self.quantize and self.quantize.qat_teacher == "float":
            self.fine_tune.require_distill("quantize.qat_teacher: float distils to the float model")
        if self.quantize and self.quantize.kernel_bits and self.quantize.preserve and (self.prune or self.cluster):
            raise ValueError("quantize.kernel_bits has no sparsity- or cluster-preserving QAT; drop kernel_bits, "
                             "or set quantize.preserve: false")
        self._candidate_teachers()
        if not (self.prune or self.quantize or self.cluster or self.student):
            raise ValueError("a variant needs at least one of prune, quantize, cluster, student")
        return self

    def _candidate_teachers(self) -> None:
        teachers = self.candidates.qat_teachers if self.candidates else None
        if teachers is None:
            return
        if not self.is_qat:
            raise ValueError("candidates.qat_teachers: QAT's teachers need quantize.mode: qat; remove it or use mode qat")
        if self.quantize.qat_teacher != "baseline":
            raise ValueError("give the QAT teacher once: candidates.qat_teachers or quantize.qat_teacher, not both")
        if "float" in teachers:
            self.fine_tune.require_distill("candidates.qat_teachers: float distils to the float model")
