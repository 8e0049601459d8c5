"""What building a variant did, as typed records: its fine-tunes, sparsity, clusters, input normalization.

They land in the variant's `compression` record (results.json) beside its recipe fields. A field
that a build did not set is left out of the JSON, as the build details always were.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, JsonValue

from compress_dqn.rl.callbacks import Selection


class Details(BaseModel):
    """A build record whose JSON holds only the fields the build set (None included, where set)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_dict(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json", exclude_unset=True)


class FineTune(Details):
    """One recovery (or QAT) fine-tune: distillation (final_loss) or TD learning (env_steps)."""

    method: str
    gradient_steps: int
    final_loss: float | None = None
    env_steps: int | None = None
    selection: Selection | None = None
    shared: str | None = None
    """A pruning loaded from the run's shared folder (variants/_shared/NAME.npz): which one."""
    preserve: str | None = None
    """QAT's preserved structure: "sparsity" (PQAT), "clusters" (CQAT) or None."""


class InputNormalization(Details):
    """The per-feature (obs - mean) / std an integer policy carries in front of its input."""

    mean: list[float]
    std: list[float]
    scaling: str


class BuildDetails(Details):
    """Everything a variant's build recorded; each technique sets its own fields."""

    fine_tune: FineTune | None = None
    qat: FineTune | None = None
    cluster_fine_tune: FineTune | None = None
    """A student's clustered fine-tune after its distillation (fine_tune)."""
    sparsity: dict[str, float] | None = None
    """Share of exact zeros per pruned layer's kernel."""
    sparsity_after_qat: dict[str, float] | None = None
    unique_kernel_values: dict[str, int] | None = None
    """Distinct values per clustered layer's kernel."""
    input_normalization: InputNormalization | None = None
