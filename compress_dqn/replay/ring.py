"""A ring of named, preallocated numpy arrays (in RAM or np.memmap on disk) with array-only state.

The storage half of the replay buffer, as Dopamine's circular buffer splits it: rows advance
together and know nothing of transitions, so checkpointing is generic: the arrays plus the write
position and fill level, all plain numpy arrays that ``np.load(..., allow_pickle=False)`` reads.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import numpy.typing as npt

from compress_dqn.errors import UserError
from compress_dqn.replay.budget import check_disk, check_memory, format_bytes

__all__ = ["Ring"]

_SCALARS = ("position", "size")


def _alloc(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A zeroed array whose pages are all touched now.

    np.empty + fill(0) rather than np.zeros: zeros may hand back lazily mapped pages, so RSS
    would creep up as the ring fills and an out-of-memory failure would come hours later.
    """
    arr = np.empty(shape, dtype=dtype)
    arr.fill(0)
    return arr


def _reserve_file(path: Path, nbytes: int) -> None:
    """Create ``path`` with ``nbytes`` of disk blocks reserved now.

    A sparse file would only run out of disk when a page is first written back, which kills
    the process with SIGBUS hours into training.
    """
    with open(path, "w+b") as f:
        f.truncate(nbytes)
        if not hasattr(os, "posix_fallocate"):
            return
        try:
            os.posix_fallocate(f.fileno(), 0, nbytes)
        except OSError as err:
            if err.errno == errno.ENOSPC:
                raise UserError(
                    f"replay memmap file {path} needs {format_bytes(nbytes)} but the disk "
                    f"of {path.parent} ran out of space reserving it; point memmap_path "
                    "at a disk with more space or lower train.buffer_size"
                ) from None
            # EINVAL/EOPNOTSUPP: this filesystem cannot reserve; go on sparse.


def _alloc_memmap(path: Path, shape: tuple[int, ...], dtype: np.dtype) -> np.memmap:
    """A zeroed scratch file at ``path`` (created or overwritten), its disk space reserved."""
    nbytes = math.prod(shape) * dtype.itemsize
    check_disk(path, nbytes)
    _reserve_file(path, nbytes)
    return np.memmap(path, dtype=dtype, mode="r+", shape=shape)


class Ring:
    """``capacity`` rows of named arrays sharing one write position.

    :param fields: name -> (shape of one row, dtype), in state_dict order.
    :param memmap: name -> scratch file path for the fields kept on disk instead of in RAM.
    :raises UserError: if the RAM arrays do not fit in available memory, or a memmap file on
        its disk; checked before anything is allocated.
    """

    def __init__(
        self,
        capacity: int,
        fields: Mapping[str, tuple[tuple[int, ...], npt.DTypeLike]],
        memmap: Mapping[str, Path] | None = None,
    ) -> None:
        memmap = dict(memmap or {})
        specs = {name: ((capacity, *shape), np.dtype(dtype)) for name, (shape, dtype) in fields.items()}
        ram_row = sum(math.prod(s[1:]) * dt.itemsize for name, (s, dt) in specs.items() if name not in memmap)
        check_memory(capacity, ram_row)
        self.arrays: dict[str, np.ndarray] = {
            name: _alloc_memmap(memmap[name], s, dt) if name in memmap else _alloc(s, dt)
            for name, (s, dt) in specs.items()
        }
        self.capacity = capacity
        self.pos = 0  # next row to write
        self.size = 0  # rows written so far, at most capacity

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]

    @property
    def nbytes(self) -> int:
        """Bytes of all arrays, memmap files included."""
        return int(sum(a.nbytes for a in self.arrays.values()))

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Keys :meth:`state_dict` writes and :meth:`load_state_dict` needs."""
        return (*self.arrays, *_SCALARS)

    def advance(self) -> int:
        """Move past the row at the write position (now written) and return its index."""
        j = self.pos
        self.pos = j + 1 if j + 1 < self.capacity else 0
        if self.size < self.capacity:
            self.size += 1
        return j

    def state_dict(self) -> dict[str, np.ndarray]:
        """The live arrays (not copies), then position and size as 0-d int64 arrays."""
        return {
            **self.arrays,
            "position": np.array(self.pos, dtype=np.int64),
            "size": np.array(self.size, dtype=np.int64),
        }

    def check_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Raise ValueError unless ``state`` fits this ring: same array shapes and dtypes, position
        and size within capacity. Separate from loading so a caller can check all parts first."""
        for key, dst in self.arrays.items():
            src = np.asarray(state[key])
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(
                    f"replay state {key!r} is {src.dtype}{src.shape}, "
                    f"this buffer expects {dst.dtype}{dst.shape}"
                )
        pos, size = int(state["position"]), int(state["size"])
        if not (0 <= size <= self.capacity and 0 <= pos < self.capacity):
            raise ValueError(f"replay state has position {pos} / size {size} outside capacity {self.capacity}")

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy a checked ``state`` into the existing arrays, so memory stays committed and no
        reference to the loaded file is kept."""
        self.check_state(state)
        for key, dst in self.arrays.items():
            np.copyto(dst, state[key])
        self.pos, self.size = int(state["position"]), int(state["size"])
