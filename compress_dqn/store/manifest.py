"""manifest.json: every artifact of a finished run with its SHA-256 and size.

Written last, when the run is complete, so its presence means "this run finished". `verify`
recomputes it; `evaluate` and `report` check the files they read against it, so a truncated or
altered artifact is refused with a clear message instead of being measured or reported.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from compress_dqn.errors import UserError
from compress_dqn.fileio import LOCK, write_text_atomic
from compress_dqn.store.layout import RunLayout

MANIFEST = RunLayout(Path(".")).manifest.name
SCHEMA_VERSION = 1
# Scratch that is not part of a finished run: the baseline's checkpoints are deleted once
# training ends, and .tmp-/.old- names are the leftovers of a killed process. Only
# baseline/checkpoints is skipped: a variant may be named "checkpoints".
_SKIP_DIR = RunLayout(Path(".")).checkpoints.parts


def _scratch(rel: Path) -> bool:
    parts = rel.parts
    return (parts[-1] == LOCK or any(part.startswith((".tmp-", ".old-")) for part in parts)
            or any(parts[i : i + 2] == _SKIP_DIR for i in range(len(parts) - 1)))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _artifacts(run_dir: Path) -> list[Path]:
    files = []
    for path in sorted(run_dir.rglob("*")):
        rel = path.relative_to(run_dir)
        if path.is_dir() or rel.as_posix() == MANIFEST:
            continue
        if _scratch(rel):
            continue
        files.append(path)
    return files


class FileEntry(BaseModel):
    """One artifact as the manifest keeps it."""

    model_config = ConfigDict(strict=True)
    sha256: str
    bytes: int


class Manifest(BaseModel):
    """manifest.json: every artifact of a finished run (path relative to the run -> SHA-256 and size)."""

    schema_version: int = SCHEMA_VERSION
    created: str
    files: dict[str, FileEntry]


def write_manifest(run_dir: Path) -> Manifest:
    """Hash every artifact under run_dir into run_dir/manifest.json (atomically)."""
    run_dir = Path(run_dir)
    manifest = Manifest(created=datetime.now(timezone.utc).isoformat(timespec="seconds"), files={
        path.relative_to(run_dir).as_posix(): FileEntry(sha256=sha256_of(path), bytes=path.stat().st_size)
        for path in _artifacts(run_dir)})
    write_text_atomic(RunLayout(run_dir).manifest, manifest.model_dump_json(indent=2))
    return manifest


def read_manifest(run_dir: Path) -> Manifest:
    path = RunLayout(run_dir).manifest
    if not path.is_file():
        raise UserError(f"{run_dir}: no {MANIFEST}; the run did not finish (rerun it to complete it) or this is not a run directory")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValidationError:
        raise UserError(f"{path}: unreadable or malformed manifest; restore it, or delete it and rerun compress-dqn run "
                        "on the directory to check and finish the run again") from None


def _problem(run_dir: Path, rel: str, expected: FileEntry) -> str | None:
    path = run_dir / rel
    if not path.is_file():
        return f"{rel} is missing"
    size = path.stat().st_size
    if size != expected.bytes:
        return f"{rel} has {size} bytes, expected {expected.bytes} (truncated or replaced)"
    if sha256_of(path) != expected.sha256:
        return f"{rel} does not match its SHA-256 (modified or corrupted)"
    return None


def verify(run_dir: Path) -> list[str]:
    """Problems found (empty: every artifact is as written); unlisted new files are reported too."""
    run_dir = Path(run_dir)
    files = read_manifest(run_dir).files
    problems = [p for rel, expected in sorted(files.items()) if (p := _problem(run_dir, rel, expected))]
    listed = set(files)
    problems += [f"{p.relative_to(run_dir).as_posix()} is not in the manifest"
                 for p in _artifacts(run_dir) if p.relative_to(run_dir).as_posix() not in listed]
    return problems


class PolicyFingerprint(NamedTuple):
    """What a run computed for one policy: its per-episode returns, its action agreement and its TFLite bytes."""

    episodes: tuple[float, ...]
    agreement: float | None
    tflite_sha256: str


def run_fingerprint(run_dir: Path) -> dict[str, PolicyFingerprint]:
    """What a single-seed run computed, leaving out timings (they vary run to run) and SavedModel
    bytes (their metadata holds the writing process's temporary path), per policy. Two runs that
    computed the same thing, whatever crashed or ran them, have equal fingerprints."""
    layout = RunLayout(run_dir)
    results = json.loads(layout.results.read_text())
    return {v["name"]: PolicyFingerprint(tuple(v["return"]["episodes"]), v["action_agreement"],
                                         sha256_of(layout.root / v["artifacts"]["tflite"]))
            for v in results["variants"]}


def find_run_dir(path: Path, levels: int = 4) -> Path | None:
    """The run directory (holding manifest.json) that contains path, if any (links resolved, so a
    link to a run's file is checked as the file)."""
    path = Path(path).resolve()
    for candidate in [path, *path.parents][: levels + 1]:
        # A run's manifest sits beside its recipe.yaml: a web app's manifest.json above a copied policy is not one.
        layout = RunLayout(candidate)
        if layout.manifest.is_file() and layout.recipe.is_file():
            return candidate
    return None


def check_artifact(path: Path) -> None:
    """Refuse an artifact that lies in a finished run directory but no longer matches its manifest.

    Files outside any run directory (a policy copied elsewhere) are not checked here; their own
    loaders refuse truncated or foreign files.
    """
    path = Path(path).resolve()
    run_dir = find_run_dir(path)
    if run_dir is None:
        return
    files = read_manifest(run_dir).files
    targets = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    rels = [t.relative_to(run_dir).as_posix() for t in targets]
    if path.is_dir():  # a SavedModel directory: its listed files must all be there too
        prefix = path.relative_to(run_dir).as_posix() + "/"
        rels = sorted(set(rels) | {rel for rel in files if rel.startswith(prefix)})
    for rel in rels:
        if rel not in files:
            raise UserError(f"{run_dir / rel}: not in {run_dir / MANIFEST}; it was added after the run finished")
        problem = _problem(run_dir, rel, files[rel])
        if problem:
            raise UserError(f"{run_dir}: {problem}; rerun compress-dqn run in a new directory (or restore the file)")
