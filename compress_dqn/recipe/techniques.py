"""The recipe's technique blocks besides quantization: prune, cluster, student, fine_tune and candidates."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from compress_dqn.recipe.seed_range import SeedRange
from compress_dqn.recipe.train import ConvLayer
from compress_dqn.recipe.values import (
    Count,
    LearningRate,
    PositiveCount,
    Probability,
    QatTeacher,
    StrictModel,
    count_from,
    real_between,
)


class PruneSettings(StrictModel):
    """Magnitude pruning less its target: how, when and where (a search's pruned family; its
    sparsities give each rung's target)."""

    schedule: Literal["polynomial", "constant"] = "polynomial"
    """PolynomialDecay (ramp from 0 to sparsity) or ConstantSparsity (at sparsity from begin)."""
    begin_fraction: Probability = 0.0
    """When pruning starts, as a share of the fine-tune's gradient steps."""
    end_fraction: Probability = 0.6
    """When the polynomial ramp reaches the target (the rest of the fine-tune recovers)."""
    frequency: PositiveCount = 50
    """Gradient steps between mask updates."""
    exclude: list[str] = Field(default_factory=list)
    """Layer names kept dense, e.g. [q_values] for the output layer."""
    sparse_format: bool = True
    """Store pruned kernels in TFLite's sparse format where that makes the file smaller and acts the
    same. The full runtime expands them at load (a DENSIFY op); TFLite Micro has no such kernel,
    so set false for a microcontroller policy."""

    @model_validator(mode="after")
    def _ordered(self) -> PruneSettings:
        if self.schedule == "polynomial" and self.end_fraction <= self.begin_fraction:
            raise ValueError(f"end_fraction {self.end_fraction} must be after begin_fraction {self.begin_fraction}")
        return self


class _Sparsity(StrictModel):
    sparsity: real_between(0.0, 1.0, hi_open=True)
    """Target share of zero weights in each pruned layer's kernel."""


class PruneConfig(PruneSettings, _Sparsity):  # _Sparsity last: sparsity stays the first key written
    """Magnitude pruning (tfmot prune_low_magnitude), reached during the recovery fine-tune."""


class ClusterConfig(StrictModel):
    """Weight clustering (tfmot cluster_weights): each kernel keeps only `clusters` distinct values."""

    clusters: count_from(2)
    """Number of centroids per layer."""
    init: Literal["kmeans_plus_plus", "linear", "density_based", "random"] = "kmeans_plus_plus"
    """Centroid initialisation."""
    exclude: list[str] = Field(default_factory=list)
    """Layer names left unclustered."""
    steps: PositiveCount | None = None
    """A student's clustered fine-tune, after its distillation in float (gradient steps); default:
    the variant's fine_tune.steps. Clustering a student's random start would train all of its
    distillation through the wrapper, at ~2x the cost a step."""
    learning_rate: LearningRate | None = None
    """The clustered fine-tune's Adam step size after a student's distillation; default: fine_tune's."""


class StudentConfig(StrictModel):
    """A smaller network trained by Q-value distillation from the baseline."""

    net_arch: list[PositiveCount]
    """Hidden Dense layer widths of the student, e.g. [32, 32]."""
    activation: Literal["relu", "tanh"] = "relu"
    conv: list[ConvLayer] = Field(default_factory=list)
    """Conv2D layers before the Dense ones (empty: an MLP student on the flattened observation)."""
    from_teacher: Literal["gap", "activation", "magnitude"] | None = None
    """Start as the baseline's best-ranked conv filters and dense units with their weights (structured
    pruning), not fresh weights: ranked by the action gap each carries (gap: |activation x d gap /
    d activation|), by its activation times its outgoing weights (activation), or by its incoming
    weights (magnitude). Needs the baseline's layers, none wider, with its conv kernels and strides."""


class FineTuneConfig(StrictModel):
    """Recovery fine-tune after wrapping a model for pruning, clustering or QAT."""

    method: Literal["distill", "td"] = "distill"
    """distill: regress Q-values to the frozen baseline's on replay observations (no env steps);
    td: continue DQN training in the environment with the baseline's replay and target."""
    steps: PositiveCount = 5000
    """Gradient steps (distill) or environment steps (td)."""
    learning_rate: LearningRate = 1e-4
    """Adam step size of the fine-tune."""
    learning_rate_schedule: Literal["constant", "linear"] = "constant"
    """linear: decay the step size linearly to 0 over the fine-tune's steps, so that its last
    weights are settled rather than one noisy step among many."""
    batch_size: PositiveCount = 256
    """Observations per distillation step (td uses train.batch_size)."""
    loss: Literal["policy", "mse"] = "policy"
    """distill loss: policy = KL of softmax(Q/temperature) (keeps the action ranking; Rusu et al.
    2016) + Q error / Q variance (keeps the scale); mse = squared Q error (can flip near-tied actions)."""
    temperature: real_between(0.0, None, lo_open=True) = 0.01
    """Softmax temperature of the policy loss, in Q units: gaps above it are ranked sharply."""
    advantage_weight: real_between(0.0, None) = 0.0
    """policy loss: add the advantages' (Q - mean over actions) squared error over their variance,
    times this. The Q term is scaled by the Q-values' variance across states, which dwarfs the
    action gaps, so a student can match Q well with gaps a fraction of the teacher's; an int8 step
    then flips its actions. 0: off. On a MinAtar student it widened the int8 gaps but cost more
    agreement than it kept (the largest advantages dominate the error; docs/minatar.md)."""
    margin_weight: real_between(0.0, None) = 0.0
    """policy loss: add, times this, how far the student's lead of the teacher's best action over its
    own next best falls short of the teacher's lead (its best less second-best Q-value), over the
    advantages' spread: a hinge on the ranking that weighs each state by its gap, where the KL at
    temperature 0.01 is flat once an action is ranked first. 0: off."""
    select_interval: Count = 0
    """Every this many gradient steps (and at the end), play the model on select_episodes episodes
    from train.eval_seed and keep the best weights, as the baseline's training does; 0: keep the last."""
    select_episodes: PositiveCount = 10
    """Episodes per selection evaluation (seeds train.eval_seed.., never the final evaluation's)."""
    student_states: Count = 0
    """distill: after every student_states_interval gradient steps, the model plays this many
    environment steps greedily and the baseline labels the states it visits; half of each later
    batch comes from those states (DAgger). Teaches a student where its own errors lead, which
    replay states never show it. 0: replay states only. Images and frame stacks too: the
    student plays the environment as training built it."""
    student_states_interval: PositiveCount = 5000
    """Gradient steps between the student's plays (see student_states)."""

    @model_validator(mode="after")
    def _states_need_distillation(self) -> FineTuneConfig:
        if self.student_states and self.method != "distill":
            raise ValueError("student_states labels states with the baseline: it needs method: distill")
        return self

    def require_distill(self, why: str) -> None:
        """Refuse a method other than distill where `why` (a student, a float QAT teacher) needs it."""
        if self.method != "distill":
            raise ValueError(f"{why}: fine_tune.method must be distill")


class CandidatesConfig(StrictModel):
    """Build the variant `count` times and keep the build that plays best on fresh episodes.

    Why: a fine-tuned build is one draw of its seed, and builds of one variant can land on both
    sides of the margin; a paired difference on fresh episodes ranks builds much as the full
    evaluation does (docs/students.md, benchmarks/student_replicas.py). Candidate k is built as a
    variant named NAME.cK would be (its seeds follow its name), without loading a pruning other
    variants share."""

    count: count_from(2) = 3
    """Builds to choose from; the variant costs that many builds."""
    episodes: PositiveCount = 200
    """Fresh episodes each candidate plays (seeds seed..); the baseline plays them too, paired."""
    seed: Count = 200000
    """First seed of those episodes: apart from the evaluation's, the selection's and the held-out ones."""
    qat_teachers: list[QatTeacher] | None = None
    """QAT each build's float model once per teacher listed (quantize.qat_teacher), each result a
    candidate: `count` builds give count x len(qat_teachers) candidates for the cost of `count`
    distillations: a second QAT is another draw for less than another distillation (on MinAtar
    Breakout it kept no better build than QAT to the baseline, docs/minatar.md). null: the
    variant's quantize.qat_teacher alone."""

    @property
    def seed_range(self) -> SeedRange:
        """The fresh episodes each candidate plays."""
        return SeedRange.of(self.seed, self.episodes)

    @model_validator(mode="after")
    def _distinct_teachers(self) -> CandidatesConfig:
        if self.qat_teachers is not None and (not self.qat_teachers or len(set(self.qat_teachers)) != len(self.qat_teachers)):
            raise ValueError("candidates.qat_teachers: list each teacher once, e.g. [baseline, float]")
        return self
