"""Errors the command line turns into one line and exit code 2."""

from __future__ import annotations

import errno
import os
from pathlib import Path

# Writes a user can make succeed (free space, make the place writable, or write elsewhere), each
# with what happened and what to do. Every writer maps them through WriteRefused, so a full or
# read-only disk reads the same whichever file it stopped: TensorBoard's, a checkpoint, an export.
_REFUSALS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no space left on device", "free some space"),
    errno.EDQUOT: ("disk quota exceeded", "free some space or raise the quota"),
    errno.EROFS: ("read-only file system", "remount it read-write"),
    errno.EACCES: ("permission denied", "give yourself write permission there"),
    errno.EPERM: ("operation not permitted", "give yourself write permission there"),
}


class UserError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class WriteRefused(UserError):
    """A write the disk refused (full, over quota, read-only, not ours): one line with the path and the fix.

    Picklable with its fields, so one raised in a worker process reads the same in the parent.
    """

    def __init__(self, code: int, path: str | Path | None = None, note: str = "") -> None:
        problem, fix = _REFUSALS.get(code, (os.strerror(code).lower(), "free some space"))
        where = f"cannot write {path}: " if path else "cannot write: "
        super().__init__(f"{where}{problem}{note}; {fix} (or pass another --out) and rerun the same command: "
                         "a run resumes where it stopped")
        self.code, self.path, self.note = code, None if path is None else str(path), note

    def __reduce__(self) -> tuple[type, tuple[int, str | None, str]]:
        return type(self), (self.code, self.path, self.note)


def refusal_errno(exc: BaseException) -> int | None:
    """The errno of a write the disk refused, else None: an OSError's own, or the one whose text a
    library's error carries (TensorFlow's file errors are not OSErrors; they end in the OS's text)."""
    if isinstance(exc, OSError):
        return exc.errno if exc.errno in _REFUSALS else None
    text = str(exc)
    return next((code for code in _REFUSALS if os.strerror(code) in text), None)
