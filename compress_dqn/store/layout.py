"""Every path of a run directory, in one place: where each stage writes and every reader looks.

    RUN/
      recipe.yaml            the resolved recipe (a rerun with a different recipe is refused)
      stages.json            finished stages and what they produced (a finished stage is not redone)
      results.json, results.csv, report.md, report.html, *.png   the results and their report
      search.json            a search's finished candidates
      gpu/POLICY.json        `bench --device gpu` figures attached by `report --gpu` (results.json's gpu_serving)
      manifest.json          SHA-256 and size of every artifact: written last, its presence means finished
      tensorboard/baseline/  TensorBoard scalars of the baseline's training
      baseline/              weights.npz, replay.npz, heldout_obs.npz, model.keras (a brought network),
                             checkpoints/ (while training), saved_model/, policy.tflite
      variants/NAME/         saved_model/, policy.tflite, candidates/ (while picking the best build)
      variants/_shared/      a pruning shared by the variants that start from it
      seed-N/                one training seed's run, laid out as above (a run of several seeds)

Paths in stages.json and results.json are relative to RUN (`relative`), so a run directory can move.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BASELINE = "baseline"
"""The reference policy's name: its files live in baseline/, every variant's in variants/NAME/."""


@dataclass(frozen=True)
class PolicyFiles:
    """One policy's folder and the artifacts in it."""

    folder: Path

    @property
    def tflite(self) -> Path:
        return self.folder / "policy.tflite"

    @property
    def saved_model(self) -> Path:
        return self.folder / "saved_model"

    def candidate(self, name: str) -> PolicyFiles:
        """Where candidate build `name` of this policy is written before the best one is kept."""
        return PolicyFiles(self.candidates / name)

    @property
    def candidates(self) -> Path:
        return self.folder / "candidates"


@dataclass(frozen=True)
class RunLayout:
    """The paths of one run directory (or of a run of several seeds, whose seeds are runs too)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.yaml"

    @property
    def stages(self) -> Path:
        return self.root / "stages.json"

    @property
    def results(self) -> Path:
        return self.root / "results.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def search_log(self) -> Path:
        return self.root / "search.json"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def tensorboard(self, label: str = BASELINE) -> Path:
        return self.root / "tensorboard" / label

    @property
    def baseline(self) -> Path:
        return self.root / BASELINE

    @property
    def checkpoints(self) -> Path:
        return self.baseline / "checkpoints"

    @property
    def weights(self) -> Path:
        return self.baseline / "weights.npz"

    @property
    def replay(self) -> Path:
        return self.baseline / "replay.npz"

    @property
    def heldout(self) -> Path:
        return self.baseline / "heldout_obs.npz"

    @property
    def keras_model(self) -> Path:
        """A brought baseline's network, kept as a Keras file (a trained one is rebuilt from the recipe)."""
        return self.baseline / "model.keras"

    @property
    def gpu_figures(self) -> Path:
        """Where attached GPU serving figures live, one file a policy."""
        return self.root / "gpu"

    @property
    def variants(self) -> Path:
        return self.root / "variants"

    @property
    def shared_pruning(self) -> Path:
        return self.variants / "_shared"

    def policy(self, name: str) -> PolicyFiles:
        """The baseline's files or variant `name`'s."""
        return PolicyFiles(self.baseline if name == BASELINE else self.variants / name)

    def seed(self, seed: int) -> RunLayout:
        """Training seed `seed`'s run inside a run of several seeds."""
        return RunLayout(self.root / f"seed-{seed}")

    def relative(self, path: Path) -> str:
        """`path` as stages.json and results.json record it: relative to the run, with / separators."""
        return Path(path).relative_to(self.root).as_posix()

    def artifacts(self, name: str) -> dict[str, str]:
        """A policy's artifacts as its records name them: {"saved_model": ..., "tflite": ...}, relative."""
        files = self.policy(name)
        return {"saved_model": self.relative(files.saved_model), "tflite": self.relative(files.tflite)}

    @property
    def trained(self) -> bool:
        """Whether the baseline's network and the replay it trained on are both there."""
        return self.weights.is_file() and self.replay.is_file()

    @property
    def holds_a_run(self) -> bool:
        """A single seed's run (recipe.yaml and stages.json) or one of several seeds (seed-N/stages.json)."""
        return self.recipe.is_file() and (self.stages.is_file() or any(self.root.glob("seed-*/stages.json")))

    @classmethod
    def find(cls, path: str | Path) -> RunLayout | None:
        """The run that `path` names (the run itself or its baseline/ folder), or None."""
        path = Path(path)
        if not path.is_dir():
            return None
        layout = cls(path.parent if path.name == BASELINE else path)
        return layout if layout.holds_a_run else None
