"""The run directory: create it or check that it holds this recipe, lock it, and reruns that extend it.

A rerun of the same recipe resumes; one that changes only what is built from the baseline (its
variants, its search, the evaluation caps) extends it; any other is refused with the keys that differ. A
killed process's temporaries are dropped; a finished run's manifest is checked first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import JsonValue

from compress_dqn.errors import UserError
from compress_dqn.evaluation.results import RunResults, SeedsResults
from compress_dqn.fileio import LOCK, lock_run_dir, remove_dir, remove_stale_temporaries, write_text_atomic
from compress_dqn.recipe.safe_yaml import read_yaml
from compress_dqn.recipe.schema import Recipe, SearchConfig, recipe_from_data
from compress_dqn.run.ladders import candidate_variants
from compress_dqn.store.layout import RunLayout
from compress_dqn.store.manifest import verify
from compress_dqn.store.stage_keys import StageKey
from compress_dqn.store.stages import Stages


@dataclass
class RunOutcome:
    """Where the run lives and what it produced."""

    run_dir: Path
    results: RunResults | SeedsResults
    resumed: bool

    @property
    def baseline_return(self) -> float:
        """The baseline's mean return (over several seeds, the IQM of the seeds' means)."""
        if isinstance(self.results, SeedsResults):
            return self.results.aggregate[0].iqm_return
        return self.results.baseline.returns.mean


def differing_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two recipes as data (a list counts as one value)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [key for name in sorted(set(old) | set(new))
                for key in differing_keys(old.get(name), new.get(name), f"{prefix}.{name}" if prefix else name)]
    return [] if old == new else [prefix]


_PLACEMENT_KEYS = ("executor", "address", "workers")
"""Where units run does not change what they compute: a sweep may resume on another engine."""
REUSABLE_KEYS = ("name", "variants", "search", "eval.max_episodes", "eval.tolerance")
"""What a rerun may change on a finished baseline: what is built from it (the listed variants, the
search's ladders) and how long verdicts may play. A key counts with everything below it."""


def _reusable(key: str) -> bool:
    return any(key == k or key.startswith(f"{k}.") for k in REUSABLE_KEYS)


def _describe(old: Any, new: Any, key: str) -> str:
    """`key: old -> new` where both are short, else the key alone (a variants list would fill the screen)."""
    for part in key.split("."):
        old = old.get(part) if isinstance(old, dict) else None
        new = new.get(part) if isinstance(new, dict) else None
    text = f"{key}: {old!r} -> {new!r}"
    return text if len(text) <= 80 else key


def prepare_run_dir(recipe: Recipe, run_dir: Path, log: Callable[[str], None] | None = None) -> bool:
    """Create the run directory, or check an existing one holds this same recipe. Returns resumed.

    A recipe that differs only in REUSABLE_KEYS takes over a started run: its baseline is kept and
    variants whose definition changed or went away are deleted, so the resume (Stages.forget_missing)
    builds just what is new.
    """
    layout = RunLayout(run_dir)
    recipe_file = layout.recipe
    new = recipe.to_dict()
    if recipe_file.exists():
        lock_run_dir(run_dir)
        try:
            old = recipe_from_data(read_yaml(recipe_file), str(recipe_file)).to_dict()
        except (UserError, yaml.YAMLError):
            raise UserError(f"{run_dir}: its recipe.yaml is unreadable; pass another --out or delete the directory") from None
        for key in _PLACEMENT_KEYS:
            old.pop(key, None)
        diff = differing_keys(old, {k: v for k, v in new.items() if k not in _PLACEMENT_KEYS})
        if diff and not _started(run_dir):  # a run refused before its first stage: take the corrected recipe
            write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
            return False
        if not all(_reusable(key) for key in diff):
            fixed = [key for key in diff if not _reusable(key)]
            shown = "; ".join(_describe(old, new, key) for key in fixed[:3]) + (" ..." if len(fixed) > 3 else "")
            raise UserError(
                f"{run_dir}: holds a run of a different recipe ({shown}): these change the baseline; pass another "
                f"--out or delete the directory (on a finished baseline only {', '.join(REUSABLE_KEYS[1:])} may change)")
        remove_stale_temporaries(run_dir)  # what a killed process was writing
        _check_manifest(run_dir)
        if diff:
            _drop_changed_variants(old, new, run_dir, log)
            # A search's kept/lost calls used the old caps and the old ladders.
            if any(key.startswith(("eval.", "search")) for key in diff):
                layout.search_log.unlink(missing_ok=True)
            write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
        return True
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UserError(f"{run_dir}: exists and is not a compress-dqn run directory; pass another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    lock_run_dir(run_dir)
    write_text_atomic(recipe_file, yaml.safe_dump(new, sort_keys=False))
    return False


def _check_manifest(run_dir: Path) -> None:
    """A finished run must be intact before it is extended; from then on it is in progress again."""
    manifest = RunLayout(run_dir).manifest
    if manifest.exists():
        problems = verify(run_dir)
        if problems:
            more = f" (and {len(problems) - 1} more; see compress-dqn verify)" if len(problems) > 1 else ""
            raise UserError(f"{run_dir}: a finished run with a damaged artifact: {problems[0]}{more}; "
                            "pass another --out to rerun it")
        manifest.unlink()


def _drop_changed_variants(old: dict[str, JsonValue], new: dict[str, JsonValue], run_dir: Path,
                           log: Callable[[str], None] | None) -> None:
    """Delete the folders of variants that the new recipe defines differently or no longer has,
    the search's candidates among them (a seed's run builds those too)."""
    before, kept = ({**{v["name"]: v for v in recipe.get("variants") or []}, **_candidates(recipe)} for recipe in (old, new))
    changed = {name for name, variant in before.items() if kept.get(name) != variant}
    stages = Stages(run_dir)
    # Only what was built is dropped: a search's ladder names rungs it may never have played.
    built = {StageKey.parse(stage).name for stage in stages.policy_stages(changed)}
    layout = RunLayout(run_dir)
    dropped = [name for name in before if name in changed and (name in built or layout.policy(name).folder.exists())]
    for name in dropped:
        remove_dir(layout.policy(name).folder)
    stages.forget(stages.policy_stages(dropped))
    added = [name for name in kept if name not in before]
    if log is not None:
        log(f"{run_dir}: reusing its finished stages; new: {', '.join(added) or 'none'}; "
            f"rebuilt or dropped: {', '.join(dropped) or 'none'}")


def _candidates(recipe: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The search's candidates as variant data by name ({} without a search)."""
    if not recipe.get("search"):
        return {}
    return {v.name: v.model_dump(mode="json") for v in candidate_variants(SearchConfig.model_validate(recipe["search"]))}


def _started(run_dir: Path) -> bool:
    """Whether anything but the recipe (and a killed process's temporaries) was written in run_dir."""
    layout = RunLayout(run_dir)
    for path in run_dir.iterdir():
        if path in (layout.recipe, layout.root / LOCK) or path.name.startswith((".tmp-", ".old-")):
            continue
        if path == layout.stages and path.read_text().strip() in ("", "{}"):
            continue
        if path.is_dir() and not any(path.iterdir()):
            continue
        return True
    return False
