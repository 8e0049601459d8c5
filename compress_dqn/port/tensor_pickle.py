"""Read the tensors of a PyTorch file (torch.save) without torch and without running its pickle's code.

A .pt/.pth file is a zip holding a pickle (data.pkl) plus one raw byte blob per storage. Loading it
with `pickle` (or `torch.load(weights_only=False)`) lets the file call any Python function it names.
This unpickler admits only the globals that rebuild tensors and state dicts, maps them to numpy, and
refuses anything else with one line naming the global: a file asking for `os.system` never runs it.
The same restricted reader (with inert stand-ins for SB3's and gym's classes) reads VecNormalize
statistics and the pickled spaces of SB3 1.0 zips.
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from compress_dqn.errors import UserError

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "LongStorage": np.int64, "IntStorage": np.int32, "ShortStorage": np.int16, "CharStorage": np.int8,
    "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class _StorageType:
    """A storage class named by the pickle (torch.FloatStorage, ...): only its dtype matters here."""

    def __init__(self, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)


def _rebuild_tensor_v2(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    """torch._utils._rebuild_tensor_v2 on a numpy storage: a strided view, copied."""
    if not size:
        return np.array(storage[offset])
    itemsize = storage.dtype.itemsize
    needed = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride) if n > 0)
    if needed > storage.size or offset < 0 or any(s < 0 for s in stride):
        raise ValueError("a tensor reaches past its storage")
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                           strides=tuple(s * itemsize for s in stride), writeable=False)
    return np.array(view)


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    return data


_TENSOR_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    **{("torch", name): _StorageType(dtype) for name, dtype in _STORAGE_DTYPES.items()},
}


class RefusedPickle(Exception):
    """The pickle names a global outside the allowed set."""


class _TensorUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, storages: dict[str, bytes], allowed: dict[tuple[str, str], Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._storages = storages
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._allowed:
            return self._allowed[(module, name)]
        raise RefusedPickle(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise RefusedPickle(f"persistent id {str(pid)[:60]}")
        key = str(pid[2])
        if key not in self._storages:
            raise ValueError(f"storage {key} is missing from the archive")
        return np.frombuffer(self._storages[key], dtype=pid[1].dtype.newbyteorder("<"))


def _refused(label: str, name: str) -> UserError:
    return UserError(f"{label}: its pickle asks for {name}, which could run code; refused (only tensors "
                     "are read from it): save a plain state dict with torch.save(model.state_dict(), path)")


def read_state_dict(data: bytes, label: str) -> dict[str, np.ndarray]:
    """The tensors of a torch.save zip archive, as numpy arrays by name (nested dicts flattened with '.')."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        if data[:2] == b"\x80\x02" or data[:1] == b"\x80":
            raise UserError(f"{label}: a legacy (pre-1.6, non-zip) torch file; load it with torch and save it "
                            "again with torch.save(state_dict, path)") from None
        raise UserError(f"{label}: not a torch.save file (not a zip archive)") from None
    names = archive.namelist()
    pickles = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pickles) != 1:
        raise UserError(f"{label}: not a torch.save archive (no single data.pkl inside)")
    prefix = pickles[0][: -len("data.pkl")]
    if prefix + "byteorder" in names and archive.read(prefix + "byteorder").strip() != b"little":
        raise UserError(f"{label}: saved on a big-endian machine; save it again on a little-endian one")
    storages = {n[len(prefix) + 5:]: archive.read(n) for n in names if n.startswith(prefix + "data/")}
    try:
        loaded = _TensorUnpickler(archive.read(pickles[0]), storages, _TENSOR_GLOBALS).load()
    except RefusedPickle as exc:
        raise _refused(label, str(exc)) from None
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, KeyError, IndexError) as exc:
        raise UserError(f"{label}: its tensors cannot be read ({str(exc)[:120]}); a damaged file?") from None
    return _flatten(loaded, label)


def _flatten(value: Any, label: str, prefix: str = "") -> dict[str, np.ndarray]:
    if isinstance(value, np.ndarray):
        return {prefix.rstrip("."): value}
    if isinstance(value, dict):
        out: dict[str, np.ndarray] = {}
        for key, item in value.items():
            if isinstance(item, (np.ndarray, dict)):
                out.update(_flatten(item, label, f"{prefix}{key}."))
        return out
    raise UserError(f"{label}: holds a {type(value).__name__}, not a state dict of tensors; "
                    "save torch.save(model.state_dict(), path)")


class Inert:
    """A stand-in for an allowed class of a pickle: records its state, runs none of the class's code."""

    global_name = ""
    """The global the pickle named (module.name), so a reader can tell a Box from a Discrete."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @classmethod
    def named(cls, module: str, name: str) -> type[Inert]:
        """A stand-in class for the global `module.name`; it holds the name and nothing of the class."""
        return type(name, (cls,), {"global_name": f"{module}.{name}"})


def read_restricted_pickle(data: bytes, label: str, inert_prefixes: tuple[str, ...]) -> Any:
    """A plain pickle whose classes under `inert_prefixes` become Inert records and whose numpy arrays
    are rebuilt by numpy; any other global is refused with one line."""
    from numpy._core.multiarray import (  # numpy's own array rebuilders (numpy >= 2)
        _reconstruct,
        scalar,
    )
    from numpy._core.numeric import _frombuffer  # arrays pickled with protocol 5 (cloudpickle's default)

    allowed = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype, ("collections", "OrderedDict"): OrderedDict}
    for core in ("numpy.core", "numpy._core"):  # pickles from numpy 1 and 2
        allowed.update({(f"{core}.multiarray", "_reconstruct"): _reconstruct, (f"{core}.multiarray", "scalar"): scalar,
                        (f"{core}.numeric", "_frombuffer"): _frombuffer})

    class _Restricted(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in allowed:
                return allowed[(module, name)]
            if module.startswith(inert_prefixes):
                return Inert.named(module, name)
            raise RefusedPickle(f"{module}.{name}")

    try:
        return _Restricted(io.BytesIO(data)).load()
    except RefusedPickle as exc:
        raise UserError(f"{label}: its pickle asks for {exc}, which could run code; refused") from None
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, KeyError, IndexError, AttributeError) as exc:
        raise UserError(f"{label}: cannot be read as a restricted pickle ({str(exc)[:120]})") from None


def read_file(path: Path) -> bytes:
    """A user's file's bytes, with a one-line error for a missing or unreadable one."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"baseline.from: {path}: cannot be read ({exc.strerror}); check the path") from None
