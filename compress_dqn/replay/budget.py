"""Memory and disk budget checks for the replay buffer, run before anything is allocated.

Failing with a clear message at the start beats a MemoryError, the OOM killer or a SIGBUS from a
full disk hours into training.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import psutil

from compress_dqn.errors import UserError

__all__ = ["MEMORY_MARGIN", "check_bound", "check_disk", "check_memory", "format_bytes", "rows_for_budget"]

# Keep this share of available memory free when checking the allocation, so
# the buffer does not push the machine into swap or the OOM killer.
MEMORY_MARGIN = 0.9


def format_bytes(n: float, decimals: int = 2) -> str:
    """Human-readable size with binary units, for error messages (any int: a message about a huge
    request must not fail on a float overflow)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024.0:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.{decimals}f} {unit}"
        n = n / 1024 if abs(n) < 2**1000 else n // 1024
    return f"{n:.{decimals}f} TiB" if abs(n) < 2**1000 else f"{n} TiB"


def check_memory(rows: int, row_bytes: int) -> None:
    """Refuse ``rows`` x ``row_bytes`` of RAM unless it fits in the margin of available memory.

    :raises UserError: naming the sizes and the recipe settings that shrink the buffer.
    """
    total = rows * row_bytes
    available = psutil.virtual_memory().available
    if total > MEMORY_MARGIN * available:
        raise UserError(
            f"replay buffer needs {format_bytes(total)} "
            f"({rows} transitions x {format_bytes(row_bytes)}) "
            f"but only {format_bytes(available)} of memory is available "
            f"(at most {MEMORY_MARGIN:.0%} of it is used); "
            "lower train.buffer_size or set replay.memory"
        )


def check_bound(bound: int) -> None:
    """Refuse a compressed buffer whose byte bound does not fit in the margin of available memory:
    its frames are not allocated up front, so the bound is what is promised not to be exceeded.

    :raises UserError: naming the bound and the setting that lowers it.
    """
    available = psutil.virtual_memory().available
    if bound > MEMORY_MARGIN * available:
        raise UserError(
            f"compressed replay buffer may grow to {format_bytes(bound)} but only {format_bytes(available)} "
            f"of memory is available (at most {MEMORY_MARGIN:.0%} of it is used); set replay.memory "
            "(what it may hold) or lower train.buffer_size"
        )


def check_disk(path: Path, nbytes: int) -> None:
    """Refuse a ``nbytes`` scratch file at ``path`` unless its directory exists and has the room.

    An existing file there is overwritten, so its size counts as free.

    :raises UserError: if the directory is missing or its disk is too full.
    """
    directory = path.parent
    if not directory.is_dir():
        raise UserError(f"replay memmap directory {directory} does not exist; create it or change memmap_path")
    existing = path.stat().st_size if path.is_file() else 0
    free = shutil.disk_usage(directory).free
    if nbytes - existing > free:
        raise UserError(
            f"replay memmap file {path} needs {format_bytes(nbytes)} ({nbytes} bytes) "
            f"but only {format_bytes(free)} ({free} bytes) is free on {directory}; "
            "point memmap_path at a disk with more space or lower train.buffer_size"
        )


def rows_for_budget(budget_bytes: int, row_bytes: int, minimum: int) -> int:
    """Rows of ``row_bytes`` that fit in ``budget_bytes``, so users can size the buffer by memory.

    :raises UserError: if fewer than ``minimum`` rows (one transition's worth) fit.
    """
    rows = int(budget_bytes) // row_bytes if budget_bytes > 0 else 0
    if rows < minimum:
        raise UserError(
            f"replay memory budget of {format_bytes(budget_bytes)} ({int(budget_bytes)} bytes) "
            f"holds {rows} rows but the buffer needs at least {minimum} "
            f"({format_bytes(row_bytes)} = {row_bytes} bytes per transition); "
            "raise replay.memory"
        )
    return rows
