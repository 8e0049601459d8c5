"""The run directory: create it or check that it holds this recipe, lock it, and stages.json.

A rerun of the same recipe resumes; one of a different recipe is refused with the first key that
differs; a killed process's temporaries are dropped; a finished run's manifest is checked first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import RunResults, SeedsResults
from compress_dqn.fileio import LOCK, lock_run_dir, remove_stale_temporaries, write_text_atomic
from compress_dqn.recipe.safe_yaml import read_yaml
from compress_dqn.recipe.schema import Recipe, recipe_from_data
from compress_dqn.run.manifest import MANIFEST, verify
from compress_dqn.run.stage_keys import PER_POLICY_KINDS, StageKey


@dataclass
class RunOutcome:
    """Where the run lives and what it produced."""

    run_dir: Path
    results: RunResults | SeedsResults
    resumed: bool


def _first_difference(old: Any, new: Any, prefix: str = "") -> str | None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            found = _first_difference(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else key)
            if found:
                return found
        return None
    return None if old == new else f"{prefix}: {old!r} -> {new!r}"


_PLACEMENT_KEYS = ("executor", "address", "workers")


def prepare_run_dir(recipe: Recipe, run_dir: Path) -> bool:
    """Create the run directory, or check an existing one holds this same recipe. Returns resumed."""
    recipe_file = run_dir / "recipe.yaml"
    new = recipe.to_dict()
    if recipe_file.exists():
        lock_run_dir(run_dir)
        try:
            old = recipe_from_data(read_yaml(recipe_file), str(recipe_file)).to_dict()
        except (UserError, yaml.YAMLError):
            raise UserError(f"{run_dir}: its recipe.yaml is unreadable; pass another --out or delete the directory") from None
        # Where units run does not change what they compute: a sweep may resume on another engine.
        for key in _PLACEMENT_KEYS:
            old.pop(key, None)
        diff = _first_difference(old, {k: v for k, v in new.items() if k not in _PLACEMENT_KEYS})
        if diff and not _started(run_dir):  # a run refused before its first stage: take the corrected recipe
            write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
            return False
        if diff:
            raise UserError(
                f"{run_dir}: holds a run of a different recipe ({diff}); pass another --out or delete the directory"
            )
        remove_stale_temporaries(run_dir)  # what a killed process was writing
        if (run_dir / MANIFEST).exists():
            problems = verify(run_dir)
            if problems:
                more = f" (and {len(problems) - 1} more; see compress-dqn verify)" if len(problems) > 1 else ""
                raise UserError(f"{run_dir}: a finished run with a damaged artifact: {problems[0]}{more}; "
                                "pass another --out to rerun it")
            # From here on files get rewritten: the run is in progress again until a new manifest.
            (run_dir / MANIFEST).unlink()
        return True
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir}: exists and is not a compress-dqn run directory; pass another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
    return False


def _started(run_dir: Path) -> bool:
    """Whether anything but the recipe (and a killed process's temporaries) was written in run_dir."""
    for path in run_dir.iterdir():
        if path.name in ("recipe.yaml", LOCK) or path.name.startswith((".tmp-", ".old-")):
            continue
        if path.name == "stages.json" and path.read_text().strip() in ("", "{}"):
            continue
        if path.is_dir() and not any(path.iterdir()):
            continue
        return True
    return False


class Stages:
    """stages.json: each finished stage's outputs; written atomically after every stage."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "stages.json"
        try:
            self.done: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (ValueError, UnicodeDecodeError):
            self.done = None  # type: ignore[assignment]
        if not isinstance(self.done, dict):
            raise UserError(f"{self.path}: unreadable (not the JSON compress-dqn writes); pass another --out, "
                            "or delete the directory to start the run again")

    def finish(self, name: str, outputs: dict[str, Any]) -> None:
        self.done[name] = outputs
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.done, indent=2))

    def forget_missing(self, run_dir: Path) -> list[str]:
        """Forget every finished stage whose files are gone (a variant folder deleted to rebuild it,
        a lost baseline), with the stages built on it, so that a resume redoes them instead of
        finishing a run whose results point at nothing. Returns the stages forgotten."""
        def missing(name: str, outputs: Any) -> bool:
            files = ["baseline/weights.npz", "baseline/replay.npz"] if name == "train" else []
            if isinstance(outputs, dict) and isinstance(outputs.get("artifacts"), dict):
                files += [f for f in outputs["artifacts"].values() if isinstance(f, str)]
            return any(not (run_dir / f).exists() for f in files)

        gone = [name for name, outputs in self.done.items() if missing(name, outputs)]
        if not gone:
            return []
        if any(name in ("train", "export") for name in gone):  # everything else starts from the baseline
            forget = [name for name in self.done if name != "train" or "train" in gone]
        else:
            parsed = {name: StageKey.parse(name) for name in self.done}
            variants = {parsed[name].name for name in gone if parsed[name].kind == "variant"}
            forget = [name for name, key in parsed.items() if key.kind in PER_POLICY_KINDS and key.name in variants]
        for name in forget:
            self.done.pop(name, None)
        self._save()
        return forget
