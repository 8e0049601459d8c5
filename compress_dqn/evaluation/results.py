"""Typed results of a run: what results.json holds, shared by the pipeline, the report, the seed aggregate and the search.

Pydantic records whose aliases keep results.json's keys (`return`, `from`): a schema_version 2 file
loads and saves back unchanged, and a key this reader does not know is ignored (both fixed by
tests/test_legacy_files.py). Version 3 added gpu_serving (GPU figures measured elsewhere, attached later). A file that is not a results file is refused in one line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from pydantic import ConfigDict, Field, ValidationError

from compress_dqn.errors import UserError
from compress_dqn.evaluation.figures import (AtOnePercent, CFigures, Comparison, Compression, LatencyBlock, MemoryBlock,
                                             MicroFigures, OpenRecord, Record, ReturnStats, SizeStats, Verdict)
from compress_dqn.evaluation.serving.figures import ServingBench
from compress_dqn.fileio import write_text_atomic

SCHEMA_VERSION = 3
READS = (2, 3)
"""The schema versions this release reads: a file keeps its own version until a figure it lacks is added."""


class EvalPlan(Record):
    """How the policies were evaluated: the episodes and their seeds, the looks, the CI level and tolerance."""

    episodes: int
    seed: int
    max_episodes: int
    looks: list[int]
    confidence: float
    tolerance: float
    heldout_seed: int
    heldout_episodes: int


class RandomFigures(Record):
    """The uniform-random policy on the evaluation's episodes: the 0% of normalized scores."""

    returns: ReturnStats = Field(alias="return")


class SourceData(OpenRecord):
    """Where a brought baseline's calibration and distillation data came from."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"path", "transitions", "steps", "epsilon"})
    kind: str
    path: str | None = None
    transitions: int | None = None
    steps: int | None = None
    epsilon: float | None = None


class BaselineSource(OpenRecord):
    """A baseline not trained here: the file it was loaded from, its digest and its data."""

    omit_unset: ClassVar[frozenset[str]] = frozenset({"sha256"})
    from_: str = Field(alias="from")
    data: SourceData
    sha256: str | None = None


ATARI_NOTE = "Atari preprocessing:"
"""How a port's note that names the Atari preprocessing it plays behind begins (port/sb3.py writes it)."""


class PortCheck(OpenRecord):
    """A policy brought from another framework: its ported Q-values against the source's own runtime.

    Stored in results.json under train.port_check (None for a Keras file or a run's baseline).
    """

    omit_unset: ClassVar[frozenset[str]] = frozenset({"reason", "runtime", "max_abs_q_diff", "action_agreement"})
    format: str
    states: int
    notes: list[str] = Field(default_factory=list)
    checked: bool
    reason: str | None = None
    runtime: str | None = None
    max_abs_q_diff: float | None = None
    action_agreement: float | None = None

    def summary(self) -> str:
        """One line for the report, with the Atari preprocessing a ported Atari agent played behind."""
        if not self.checked:
            line = f"Port from {self.format}: {self.reason}."
        else:
            dq = "not measurable (it gives actions)" if self.max_abs_q_diff is None else f"{self.max_abs_q_diff:.2g}"
            line = (f"Port from {self.format} checked against {self.runtime} on {self.states} states: largest "
                    f"|dQ| {dq}, greedy-action agreement {self.action_agreement:.3f}.")
        return " ".join([line, *(note for note in self.notes if note.startswith(ATARI_NOTE))])


class TrainFigures(OpenRecord):
    """The baseline's train stage: what training cost, or (for a brought baseline) where it came from."""

    omit_unset: ClassVar[frozenset[str]] = frozenset(
        {"env_steps", "gradient_steps", "episodes", "wall_seconds", "env_steps_per_second", "resumed_from_step",
         "selected_step", "selected_eval_return", "source", "port_check", "replay_capacity", "replay_nbytes", "device",
         "dtype_policy"})
    env_steps: int | None = None
    gradient_steps: int | None = None
    episodes: int | None = None
    wall_seconds: float | None = None
    env_steps_per_second: float | None = None
    resumed_from_step: int | None = None
    selected_step: int | None = None
    selected_eval_return: float | None = None
    source: BaselineSource | None = None
    port_check: PortCheck | None = None
    replay_capacity: int | None = None
    replay_nbytes: int | None = None
    device: str | None = None
    dtype_policy: str | None = None


class VariantResult(Record):
    """One policy's figures: the baseline (the reference) or a compressed variant."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", validate_assignment=True)
    omit_none: ClassVar[frozenset[str]] = frozenset({"compression", "return_vs_baseline", "c_policy"})
    name: str
    artifacts: dict[str, str]
    returns: ReturnStats = Field(alias="return")
    size: SizeStats
    action_agreement: float | None = None
    action_agreement_decisive: float | None = None
    latency_us: LatencyBlock = Field(default_factory=LatencyBlock)
    memory_bytes: MemoryBlock = Field(default_factory=MemoryBlock)
    micro: MicroFigures | None = None
    c_policy: CFigures | None = None
    """The policy as generated C with no runtime: flash and RAM per Cortex-M target, or why there are none;
    None where the run was measured without the `c` extra (RunResults.c_policy_note)."""
    compression: Compression | None = None
    return_vs_baseline: Comparison | None = None
    """verdicts.paired_difference(): the non-inferiority verdict against the baseline (None for it)."""

    @property
    def verdict(self) -> Verdict:
        return Verdict.REFERENCE if self.return_vs_baseline is None else self.return_vs_baseline.verdict

    @property
    def label(self) -> str:
        """The verdict as written: "reference", "within 1%", ..."""
        return "reference" if self.return_vs_baseline is None else self.return_vs_baseline.label

    @property
    def episodes(self) -> int:
        return len(self.returns.episodes)


class SearchMark(Record):
    """A seed's run of a search: the search's winner and the objective it was chosen by."""

    winner: str | None
    objective: str


class RunResults(Record):
    """One training seed's run: the baseline, its variants, and how they were evaluated."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", validate_assignment=True)
    omit_none: ClassVar[frozenset[str]] = frozenset({"search", "c_policy_note", "gpu_serving"})
    schema_version: int = SCHEMA_VERSION
    env_id: str
    eval: EvalPlan
    random: RandomFigures
    train: TrainFigures = Field(default_factory=TrainFigures)
    gpu: str
    c_policy_note: str | None = None
    """Why no policy has C figures (c_policy): the `c` extra was not installed where the run was measured.
    None where some have them, and in files written before C figures were measured."""
    variants: list[VariantResult] = Field(min_length=1)
    """The baseline first, then its variants."""
    search: SearchMark | None = None
    gpu_serving: list[ServingBench] | None = None
    """Policies served by batch on a GPU (`bench --device gpu`, attached with `report --gpu`); None where none is."""

    @property
    def baseline(self) -> VariantResult:
        return self.variants[0]

    def variant(self, name: str) -> VariantResult:
        return next(v for v in self.variants if v.name == name)

    @property
    def port_check(self) -> PortCheck | None:
        """The port check of a baseline brought from another framework (None when nothing was ported)."""
        return self.train.port_check

    @classmethod
    def from_dict(cls, data: object, source: str = "results.json") -> RunResults:
        return _validated(cls, data, source)


class SeedAggregate(Record):
    """One variant over the training seeds: IQM of per-seed returns and the per-seed verdicts."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"per_seed_at_one_percent"})
    name: str
    per_seed_mean_return: list[float]
    iqm_return: float
    iqm_return_ci95: tuple[float, float]
    iqm_difference_vs_baseline: float
    difference_ci95: tuple[float, float]
    per_seed_verdict: list[str]
    """Each seed's verdict label ("reference", "within 1%", ...)."""
    per_seed_episodes: list[int]
    tflite_gzip_bytes: int
    per_seed_at_one_percent: list[AtOnePercent | None] | None = None
    """Where eval.tolerance is wider than 1%: each seed's verdict at 1% on the same episodes (None for the baseline)."""


class SeedOutcome(Record):
    """One (seed, candidate) unit of a search: the candidate's paired verdict on that seed and its objective."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"at_one_percent", "build_seconds", "play_seconds"})
    verdict: str
    """The verdict's label ("within 1%"); `kind` is the Verdict."""
    episodes: int
    difference: float
    ci: tuple[float, float]
    margin: float
    episodes_to_decide: int | None = None
    normalized_score: float | None = None
    objective: float
    at_one_percent: AtOnePercent | None = None
    """Set where eval.tolerance is wider than 1%: the verdict at 1% on the same episodes (Comparison.at_one_percent)."""
    build_seconds: float | None = None
    """The candidate's build on this seed, its candidates' selection episodes included (its variant record's);
    None in files written before it was kept."""
    play_seconds: float | None = None
    """The looks that decided its verdict on this seed, in the process that played them."""

    @property
    def kind(self) -> Verdict | None:
        return Verdict.of(self.verdict)

    @property
    def keeps_return(self) -> bool:
        return self.kind is not None and self.kind.keeps_return


class Tried(Record):
    """What the search learned about one candidate."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"seconds", "note"})
    name: str
    family: str
    estimated_bytes: float
    outcome: str
    """kept (within tolerance on every seed), lost (a seed decided it worse), inconclusive (no seed decided it
    worse, one left it undecided at the episode cap), or skipped: why. Files written before "inconclusive" was
    told apart call such a candidate lost."""
    per_seed: dict[str, SeedOutcome] = Field(default_factory=dict)
    """By training seed (as text, the JSON's key)."""
    objective: float | None = None
    """Median over the seeds played of the measured objective."""
    seconds: float | None = None
    """Wall seconds the search spent on it (its builds and plays on every seed played)."""
    note: str | None = None
    """For an inconclusive rung: what the search did about it (run.search.bisect_family)."""


class SearchCost(Record):
    """What a search took, and where the time went."""

    omit_none: ClassVar[frozenset[str]] = frozenset(
        {"estimated_seconds", "baseline_seconds", "build_seconds", "play_seconds", "finish_seconds"})
    wall_seconds: float
    candidates_played: int
    units: int
    estimated_seconds: float | None = None
    """The whole search's wall time as estimated after its first rung was played (run.search.SearchClock)."""
    baseline_seconds: float | None = None
    """Each seed's baseline (trained, or brought and evaluated), before any candidate."""
    build_seconds: float | None = None
    """The candidates' builds, summed over seeds (their selection episodes included)."""
    play_seconds: float | None = None
    """The looks that decided the candidates' verdicts, summed over seeds."""
    finish_seconds: float | None = None
    """Each seed's run finished after the search: its listed variants, measures and report."""


class SearchSummary(Record):
    """A search's results: the winner, the front, every candidate and why it was dropped, the cost."""

    objective: str
    tolerance: float
    winner: str | None
    winner_objective: float | None
    front: list[str]
    tried: list[Tried]
    cost: SearchCost


class ExecutorInfo(Record):
    """Where a multi-seed run's units ran."""

    kind: str
    workers: int
    intra_op_threads: int


class SeedsEval(Record):
    """A multi-seed run's evaluation: each seed's file holds the rest."""

    omit_none: ClassVar[frozenset[str]] = frozenset({"tolerance"})
    episodes: int
    seed: int
    tolerance: float | None = None
    """eval.tolerance where it is wider than 1% (the report then names it); None at 1%, as files before it."""


class SeedsResults(Record):
    """A multi-seed run: where each seed's RunResults lives, and the aggregate over seeds."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", validate_assignment=True)
    omit_none: ClassVar[frozenset[str]] = frozenset({"search"})
    schema_version: int = SCHEMA_VERSION
    env_id: str
    eval: SeedsEval
    seeds: list[int]
    executor: ExecutorInfo
    runs: list[str]
    aggregate: list[SeedAggregate]
    search: SearchSummary | None = None

    @classmethod
    def from_dict(cls, data: object, source: str = "results.json") -> SeedsResults:
        return _validated(cls, data, source)


def _validated(cls: type[RunResults | SeedsResults], data: object, source: str) -> RunResults | SeedsResults:
    """data as cls, or the one-line UserError naming what is wrong with it."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: not a compress-dqn results file (a JSON object was expected)")
    version = data.get("schema_version")
    if version is None:
        raise UserError(f"{source}: not a compress-dqn results file (no schema_version)")
    if version not in READS:
        raise UserError(f"{source}: results schema_version {version!r}, this compress-dqn reads {READS[0]}-{READS[-1]}; "
                        "rerun the recipe with this version to regenerate it")
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "its top level"
        more = f" and {exc.error_count() - 1} more" if exc.error_count() > 1 else ""
        raise UserError(f"{source}: not a compress-dqn results file ({where}: {first['msg']}{more})") from None


def load_results(path: Path) -> RunResults | SeedsResults:
    """results.json of a single-seed run or of a multi-seed run (told apart by its "seeds" entry)."""
    try:
        data = json.loads(Path(path).read_text())
    except ValueError as exc:  # not JSON, or not text
        raise UserError(f"{path}: not a compress-dqn results file (not JSON: {exc})") from None
    cls = SeedsResults if isinstance(data, dict) and "seeds" in data else RunResults
    return _validated(cls, data, str(path))


def save_results(results: RunResults | SeedsResults, path: Path) -> None:
    """Write results.json atomically."""

    write_text_atomic(Path(path), json.dumps(results.to_dict(), indent=2))
