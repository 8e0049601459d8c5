"""Typed results of a run: what results.json holds, shared by the pipeline, the report and the seed aggregate.

Measurements keep their own shapes (ReturnStats, SizeStats, LatencyStats write plain dicts);
these classes fix which entries a result has, so that a reader asks `variant.size` instead of
digging `results["variants"][i]["size"]` by hand, and a renamed field fails at load time.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from compress_dqn.errors import UserError
from compress_dqn.fileio import write_text_atomic

SCHEMA_VERSION = 2


def _check_schema(data: dict[str, Any], source: str) -> None:
    version = data.get("schema_version")
    if version is None:
        raise UserError(f"{source}: not a compress-dqn results file (no schema_version)")
    if version != SCHEMA_VERSION:
        raise UserError(f"{source}: results schema_version {version!r}, this compress-dqn reads {SCHEMA_VERSION}; "
                        "rerun the recipe with this version to regenerate it")


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass
class VariantResult:
    """One policy's figures: the baseline (the reference) or a compressed variant."""

    name: str
    artifacts: dict[str, str]
    returns: dict[str, Any]
    """ReturnStats.to_dict(): mean, std, ci95, episodes (stored under "return")."""
    size: dict[str, Any]
    action_agreement: float | None = None
    action_agreement_decisive: float | None = None
    latency_us: dict[str, Any] = field(default_factory=dict)
    memory_bytes: dict[str, Any] = field(default_factory=dict)
    micro: dict[str, Any] | None = None
    compression: dict[str, Any] | None = None
    return_vs_baseline: dict[str, Any] | None = None
    """evaluate.paired_difference(): the non-inferiority verdict against the baseline (None for it)."""

    @property
    def verdict(self) -> str:
        return "reference" if self.return_vs_baseline is None else self.return_vs_baseline["verdict"]

    @property
    def episodes(self) -> int:
        return len(self.returns["episodes"])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["return"] = data.pop("returns")
        for optional in ("compression", "return_vs_baseline"):
            if data[optional] is None:
                del data[optional]
        return {"name": data.pop("name"), "artifacts": data.pop("artifacts"), "return": data.pop("return"), **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VariantResult:
        return cls(**_known(cls, {**data, "returns": data["return"]}))


@dataclass
class PortCheck:
    """A policy brought from another framework: its ported Q-values against the source's own runtime.

    Stored in results.json under train.port_check (absent for a Keras file or a trained baseline).
    """

    format: str
    checked: bool
    states: int
    notes: list[str] = field(default_factory=list)
    runtime: str | None = None
    max_abs_q_diff: float | None = None
    action_agreement: float | None = None
    reason: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PortCheck:
        return cls(**_known(cls, data))

    def summary(self) -> str:
        """One line for the report."""
        if not self.checked:
            return f"Port from {self.format}: {self.reason}."
        return (f"Port from {self.format} checked against {self.runtime} on {self.states} states: largest "
                f"|dQ| {self.max_abs_q_diff:.2g}, greedy-action agreement {self.action_agreement:.3f}.")


@dataclass
class RunResults:
    """One training seed's run: the baseline, its variants, and how they were evaluated."""

    env_id: str
    eval: dict[str, Any]
    random: dict[str, Any]
    train: dict[str, Any]
    gpu: str
    variants: list[VariantResult]
    search: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    @property
    def baseline(self) -> VariantResult:
        return self.variants[0]

    def variant(self, name: str) -> VariantResult:
        return next(v for v in self.variants if v.name == name)

    @property
    def port_check(self) -> PortCheck | None:
        """The port check of a baseline brought from another framework (None when nothing was ported)."""
        record = (self.train or {}).get("port_check")
        return PortCheck.from_dict(record) if record else None

    def to_dict(self) -> dict[str, Any]:
        data = {"schema_version": self.schema_version, "env_id": self.env_id, "eval": self.eval,
                "random": self.random, "train": self.train, "gpu": self.gpu,
                "variants": [v.to_dict() for v in self.variants]}
        if self.search is not None:
            data["search"] = self.search
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "results.json") -> RunResults:
        _check_schema(data, source)
        return cls(**_known(cls, {**data, "variants": [VariantResult.from_dict(v) for v in data["variants"]]}))


@dataclass
class SeedAggregate:
    """One variant over the training seeds: IQM of per-seed returns and the per-seed verdicts."""

    name: str
    per_seed_mean_return: list[float]
    iqm_return: float
    iqm_return_ci95: list[float]
    iqm_difference_vs_baseline: float
    difference_ci95: list[float]
    per_seed_verdict: list[str]
    per_seed_episodes: list[int]
    tflite_gzip_bytes: int

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SeedAggregate:
        return cls(**_known(cls, data))


@dataclass
class SeedsResults:
    """A multi-seed run: where each seed's RunResults lives, and the aggregate over seeds."""

    env_id: str
    eval: dict[str, Any]
    seeds: list[int]
    executor: dict[str, Any]
    runs: list[str]
    aggregate: list[SeedAggregate]
    search: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        data = {"schema_version": self.schema_version, "env_id": self.env_id, "eval": self.eval, "seeds": self.seeds,
                "executor": self.executor, "runs": self.runs, "aggregate": [asdict(a) for a in self.aggregate]}
        if self.search is not None:
            data["search"] = self.search
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "results.json") -> SeedsResults:
        _check_schema(data, source)
        return cls(**_known(cls, {**data, "aggregate": [SeedAggregate.from_dict(a) for a in data["aggregate"]]}))


def load_results(path: Path) -> RunResults | SeedsResults:
    """results.json of a single-seed run or of a multi-seed run (told apart by its "seeds" entry)."""
    data = json.loads(Path(path).read_text())
    return SeedsResults.from_dict(data, str(path)) if "seeds" in data else RunResults.from_dict(data, str(path))


def save_results(results: RunResults | SeedsResults, path: Path) -> None:
    """Write results.json atomically."""

    write_text_atomic(Path(path), json.dumps(results.to_dict(), indent=2))
