"""Artifact sizes. Gzip is where sparsity shows: a pruned TFLite file is no smaller until compressed."""

from __future__ import annotations

import gzip
from dataclasses import asdict, dataclass
from pathlib import Path


def dir_bytes(path: Path) -> int:
    """Total bytes of the files under a directory (or one file's size)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gzip_bytes(path: Path) -> int:
    """Size of the file gzipped at level 9: the download/flash cost of a policy."""
    return len(gzip.compress(Path(path).read_bytes(), compresslevel=9, mtime=0))


@dataclass(frozen=True)
class SizeStats:
    """The `size` block of results.json."""

    params: int
    nonzero_params: int
    tflite_bytes: int
    tflite_gzip_bytes: int
    saved_model_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def measure_size(params: int, nonzero_params: int, tflite: Path, saved_model: Path) -> SizeStats:
    """Sizes of one variant's artifacts."""
    return SizeStats(
        params=params,
        nonzero_params=nonzero_params,
        tflite_bytes=Path(tflite).stat().st_size,
        tflite_gzip_bytes=gzip_bytes(tflite),
        saved_model_bytes=dir_bytes(saved_model),
    )
