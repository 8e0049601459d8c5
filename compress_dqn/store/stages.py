"""stages.json: each finished stage's record, written atomically after every stage (the resume point).

Stages write typed records (store/records.py) and readers ask for one by its type:
`stages.get("export", ExportRecord)`; the JSON's keys are fixed by tests/test_legacy_files.py.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, JsonValue, ValidationError

from compress_dqn.errors import UserError
from compress_dqn.fileio import write_text_atomic
from compress_dqn.store.layout import RunLayout
from compress_dqn.store.stage_keys import PER_POLICY_KINDS, StageKey

R = TypeVar("R", bound=BaseModel)


def _parses(key: str) -> bool:
    try:
        StageKey.parse(key)
    except ValueError:
        return False
    return True


class Stages:
    """stages.json: each finished stage's outputs; written atomically after every stage."""

    def __init__(self, run_dir: Path) -> None:
        self.layout = RunLayout(run_dir)
        self.path = self.layout.stages
        try:
            self.done: dict[str, JsonValue] = json.loads(self.path.read_text()) if self.path.exists() else {}
        except (ValueError, UnicodeDecodeError):
            self.done = None  # type: ignore[assignment]
        if isinstance(self.done, dict) and not all(map(_parses, self.done)):
            self.done = None  # type: ignore[assignment]
        if not isinstance(self.done, dict):
            raise UserError(f"{self.path}: unreadable (not the JSON compress-dqn writes); pass another --out, "
                            "or delete the directory to start the run again")

    def policy_stages(self, names: Collection[str]) -> list[str]:
        """The finished stages (build, looks, measures) of the policies named."""
        return [stage for stage in self.done
                if (key := StageKey.parse(stage)).kind in PER_POLICY_KINDS and key.name in names]

    def forget(self, stages: list[str]) -> None:
        for stage in stages:
            self.done.pop(stage, None)
        if stages:
            self._save()

    def __contains__(self, name: str) -> bool:
        return name in self.done

    def get(self, name: str, kind: type[R]) -> R:
        """Finished stage `name`'s record, read as `kind` (KeyError where the stage has not finished)."""
        try:
            return kind.model_validate(self.done[name])
        except ValidationError as exc:
            raise UserError(f"{self.path}: stage {name!r} does not hold a {kind.__name__} ({exc.error_count()} "
                            "problem(s)); pass another --out, or delete the directory to start the run again") from None

    def find(self, name: str, kind: type[R]) -> R | None:
        """get(), or None where stage `name` has not finished."""
        return self.get(name, kind) if name in self.done else None

    def finish(self, name: str, record: BaseModel) -> None:
        """Record a finished stage (its record as stages.json keeps it) and save at once."""
        self.done[name] = record.model_dump(mode="json", by_alias=True)
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.done, indent=2))

    def forget_missing(self) -> list[str]:
        """Forget every finished stage whose files are gone (a variant folder deleted to rebuild it,
        a lost baseline), with the stages built on it, so that a resume redoes them instead of
        finishing a run whose results point at nothing. Returns the stages forgotten."""
        def missing(name: str, outputs: JsonValue) -> bool:
            files = [self.layout.relative(f) for f in (self.layout.weights, self.layout.replay)] if name == "train" else []
            if isinstance(outputs, dict) and isinstance(outputs.get("artifacts"), dict):
                files += [f for f in outputs["artifacts"].values() if isinstance(f, str)]
            return any(not (self.layout.root / f).exists() for f in files)

        gone = [name for name, outputs in self.done.items() if missing(name, outputs)]
        if not gone:
            return []
        if any(name in ("train", "export") for name in gone):  # everything else starts from the baseline
            forget = [name for name in self.done if name != "train" or "train" in gone]
        else:
            forget = self.policy_stages({key.name for key in map(StageKey.parse, gone) if key.kind == "variant"})
        self.forget(forget)
        return forget
