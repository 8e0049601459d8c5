"""Artifacts are written under a temporary name, synced and renamed into place, so an
interrupted run never leaves a half-written file; arrays go to npz, never pickle. A write the disk
refuses (full, read-only, no permission) is one WriteRefused line here, for every writer."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import numpy as np

from compress_dqn.errors import UserError, WriteRefused, refusal_errno


LOCK = ".lock"
_held: dict[Path, IO[bytes]] = {}


def lock_run_dir(run_dir: Path) -> None:
    """Hold an exclusive lock on run_dir for this process's lifetime. A second compress-dqn process
    on the same directory would delete the first one's temporaries on its resume and interleave
    stages.json writes; it is refused instead. The OS drops the lock when the process ends, however
    it ends (kill -9 included)."""
    key = Path(run_dir).resolve()
    if key in _held:
        return
    with refused_writes(run_dir):
        handle = open(key / LOCK, "ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            return  # a file system without locks (some network mounts): run unguarded, as before
        raise UserError(f"{run_dir}: another compress-dqn process is using this run directory; wait for it to "
                        "finish (or stop it), or pass another --out") from None
    _held[key] = handle


def release_run_dir(run_dir: Path) -> None:
    """Drop this process's lock on run_dir (lock_run_dir), where a process outlives the run it held: a test or a
    benchmark that ran `run` in its own interpreter and must now unmount or hand the directory on."""
    handle = _held.pop(Path(run_dir).resolve(), None)
    if handle is not None:
        handle.close()


@contextlib.contextmanager
def refused_writes(path: Path, also: tuple[type[BaseException], ...] = (), note: str = "") -> Iterator[None]:
    """Turn a write the disk refuses in the block (full, read-only, no permission) into one
    WriteRefused line naming path and the fix; other failures pass unchanged.

    also: a library's error types that carry the OS's text instead of being OSErrors (TensorFlow's
    tf.errors.OpError: its writers pass it, so this module stays free of TensorFlow).
    """
    try:
        yield
    except WriteRefused:
        raise
    except (OSError, *also) as exc:
        code = refusal_errno(exc)
        if code is None:
            raise
        raise WriteRefused(code, path, note) from exc


def _discard(tmp: Path) -> None:
    """Remove a half-written temporary; never raises (a read-only disk refuses even that)."""
    with contextlib.suppress(OSError):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def _tmp_name(path: Path) -> Path:
    """Unique per writing process, also across the hosts of a Ray cluster that share a run folder."""
    return path.with_name(f".tmp-{path.name}-{socket.gethostname()}-{os.getpid()}")


@contextlib.contextmanager
def _atomic(path: Path) -> Iterator[IO[bytes]]:
    """A file opened under a temporary name: on leaving, fsync'd and renamed into place; on an
    error, removed (a full disk must not also leave a half-written file behind)."""
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with refused_writes(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        _discard(tmp)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file under a temporary name, fsync, then rename into place."""
    with _atomic(path) as fh:
        fh.write(data)


def write_text_atomic(path: Path, text: str) -> None:
    """write_bytes_atomic for UTF-8 text."""
    write_bytes_atomic(path, text.encode("utf-8"))


def save_arrays(path: Path, arrays: list[np.ndarray] | dict[str, np.ndarray]) -> None:
    """np.savez (a list keeps its order) written atomically."""
    if isinstance(arrays, list):
        arrays = {f"a{i:04d}": a for i, a in enumerate(arrays)}
    with _atomic(path) as fh:
        np.savez(fh, **arrays)


def load_arrays(path: Path) -> list[np.ndarray]:
    """Arrays saved from a list, in order (allow_pickle=False)."""
    with np.load(path, allow_pickle=False) as data:
        return [data[k] for k in sorted(data.files)]


def load_dict(path: Path) -> dict[str, np.ndarray]:
    """Arrays saved from a dict (allow_pickle=False)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def replace_dir(tmp: Path, final: Path) -> None:
    """Swap a finished directory into place; the old one is removed only after the rename."""
    old = final.with_name(f".old-{final.name}-{os.getpid()}")
    with refused_writes(final):
        moved = final.exists()
        if moved:
            os.replace(final, old)
        try:
            os.replace(tmp, final)
        except OSError:
            if moved:
                os.replace(old, final)  # the previous complete one stays in place
            raise
    shutil.rmtree(old, ignore_errors=True)


def remove_dir(path: Path) -> None:
    """Remove a directory as a crash would leave it whole or gone: renamed away first, then deleted
    (a killed process leaves an .old- name that remove_stale_temporaries clears)."""
    if path.exists():
        old = path.with_name(f".old-{path.name}-{os.getpid()}")
        with refused_writes(path):
            os.replace(path, old)
        shutil.rmtree(old, ignore_errors=True)


def remove_stale_temporaries(root: Path) -> int:
    """Delete the .tmp-*/.old-* leftovers of a killed process under root; returns how many."""
    stale = [p for p in Path(root).rglob("*") if p.name.startswith((".tmp-", ".old-"))]
    removed = 0
    for path in sorted(stale, key=lambda p: len(p.parts)):
        if not path.exists() and not path.is_symlink():
            continue  # inside a directory removed just before
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed += 1
    return removed


def read_user_file(path: str | Path, expected: str) -> bytes:
    """The bytes of a file the user named, every way of not having it worded as one UserError line.

    expected: what to pass instead of a directory, e.g. "a recipe .yaml file".
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # reading /dev/zero or a FIFO never ends
            raise UserError(f"{path}: not a regular file (a device, pipe or socket); pass {expected}")
        return path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; check the path") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; pass {expected}") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
