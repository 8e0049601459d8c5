"""Compressed frame rows (replay.compress): zstd per row, XOR against its group's key, a byte budget.

Rows are grouped by index, ``GROUP`` consecutive rows to a group.  A group's first row (its key)
is compressed on its own; every other row is XORed with the key's frame and then compressed, so
what zstd sees is the change since the key (docs/replay-memory.md has the measurements behind
the codec, the level and the group size).  Any row decodes from at most two zstd frames, so a
batch decodes only the rows it needs, and the frames come out bit-identical.

Rows are written in ring order, so a group's key is rewritten before the rest of the group.
Until the ring has rewritten the whole group, its older rows still decode against the previous
key, which is kept until then (those rows are flagged STALE).

The byte budget: payloads vary in size, so the store counts the bytes it holds (payload plus a
fixed allowance per Python object) and, when a write pushes it past ``budget_bytes``, evicts the
oldest rows (the ones the ring would overwrite next), a whole group's tail at a time.  It returns
the rows it evicted so the transition index can withdraw their transitions.  Nothing here is
preallocated beyond one list slot and one byte per row, so resident memory follows what is held.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import zstandard

from compress_dqn.errors import UserError
from compress_dqn.replay.budget import format_bytes

__all__ = ["CODEC", "DELTA", "GROUP", "LAYOUT", "LEVEL", "PackedFrames", "RAW", "ROW_BYTES", "STALE", "decode_many",
           "row_allowance", "worst_case"]

CODEC = "zstd"
LEVEL = 3  # zstd level: higher levels saved little on Atari frames and cost several times the time
GROUP = 8  # rows per key frame: one more decode per stack, for a delta against a near neighbour
LAYOUT = f"{CODEC}-{LEVEL}/xor-key-{GROUP}"  # saved with the state: a different layout is refused

# Bits of the per-row kind byte; 0 = nothing stored (never written or evicted).
FILLED = np.uint8(1)
DELTA = np.uint8(2)  # payload is the frame XOR its group's key
STALE = np.uint8(4)  # ...and that key is the group's previous one, kept in old_keys
RAW = np.uint8(8)  # payload is uncompressed (zstd did not make it smaller)

# What a stored payload costs beyond its length: the bytes object's header (sys.getsizeof(b"")
# is 33) rounded up to the allocator's 16-byte granularity, plus its share of an allocation header.
_OBJECT_BYTES = 64
# What each row costs whatever it holds: a list slot (a pointer) and the kind byte.
ROW_BYTES = 8 + 1


def worst_case(capacity: int, frame_bytes: int) -> int:
    """Bytes ``capacity`` rows can hold at most: every frame stored raw, plus previous keys (rows
    are written in order, so only the group being rewritten keeps one; two for margin). A
    budget this large never evicts."""
    stored = frame_bytes + _OBJECT_BYTES
    return capacity * (ROW_BYTES + stored) + 2 * stored


def row_allowance(capacity: int, frame_bytes: int, budget: int) -> float:
    """Bytes a row may cost on average (compressed frame, its allowance, every per-row field) for
    ``capacity`` rows to fit ``budget`` (the whole buffer's): rows that cost less are never evicted."""
    return (budget - 2 * (frame_bytes + _OBJECT_BYTES)) / capacity


def decode_many(decompress: Any, frame_bytes: int, blobs: list[bytes | None], kinds: list[int],
                out: np.ndarray | None = None) -> np.ndarray:
    """Payloads decoded into one (n, frame_bytes) uint8 array (``out`` if given): RAW ones as they
    are, missing ones (unwritten rows) as zeros, as an uncompressed ring holds them.

    Each frame is copied into place as soon as it is decoded, so one frame-sized temporary is
    reused throughout: joining all decoded frames at the end kept n of them alive at once and
    cost several times the decoding itself."""
    out = np.empty((len(blobs), frame_bytes), np.uint8) if out is None else out
    if not blobs:
        return out
    into = memoryview(out).cast("B")
    for n, (blob, kind) in enumerate(zip(blobs, kinds)):
        if kind == FILLED:
            into[n * frame_bytes : (n + 1) * frame_bytes] = decompress(blob)
        elif kind:
            into[n * frame_bytes : (n + 1) * frame_bytes] = blob  # type: ignore[assignment]
        else:
            out[n] = 0
    return out


class PackedFrames:
    """``capacity`` compressed rows of one frame each, read back as numpy arrays. One reader at a
    time (as the buffer's sampling generator): batches decode into arrays the store reuses.

    :param frame_shape: shape of one row's frame; ``dtype`` its dtype.
    :param budget_bytes: most bytes the whole buffer may hold, of which ``fixed_bytes`` go to its
        other per-row arrays; past the rest (payloads, their allowance and the per-row bytes here)
        the oldest rows are evicted.
    :param protect: rows before the write position that eviction must never reach (the newest
        transition's stacks need them).
    :raises UserError: if the budget cannot hold the per-row bytes plus ``protect`` raw frames.
    """

    def __init__(self, capacity: int, frame_shape: tuple[int, ...], dtype: np.dtype, budget_bytes: int,
                 fixed_bytes: int, protect: int) -> None:
        self.shape = (capacity, *frame_shape)
        self.dtype = np.dtype(dtype)
        self.capacity = capacity
        self.frame_bytes = math.prod(frame_shape) * self.dtype.itemsize
        self.bound = int(budget_bytes)  # saved, so a loaded copy keeps the same budget
        self.budget = self.bound - fixed_bytes
        self.protect = protect + GROUP
        floor = min(capacity * ROW_BYTES + 2 * self.protect * (self.frame_bytes + _OBJECT_BYTES),
                    worst_case(capacity, self.frame_bytes))
        if self.budget < floor:
            raise UserError(
                f"replay memory budget of {format_bytes(self.bound)} cannot hold a compressed buffer of "
                f"{capacity} rows (needs at least {format_bytes(floor + fixed_bytes)}); raise replay.memory or lower "
                "train.buffer_size"
            )
        self.rows: list[bytes | None] = [None] * capacity
        self.kind = np.zeros(capacity, np.uint8)
        self.old_keys: dict[int, tuple[bytes, int]] = {}  # group -> (payload, kind) of its previous key
        self._key: tuple[int, np.ndarray] | None = None  # (row, bytes) of the newest key, for encoding
        self.held = capacity * ROW_BYTES  # bytes counted against the budget
        self.evicted = 0  # rows evicted to stay within the budget, since construction
        self._scratches = [np.empty((0, self.frame_bytes), np.uint8)] * 2  # see _scratch
        self._cctx = zstandard.ZstdCompressor(level=LEVEL)
        self._dctx = zstandard.ZstdDecompressor()

    # ----------------------------------------------------------------- sizes

    @property
    def nbytes(self) -> int:
        """Bytes held: payloads with their allowance, the kind bytes and the row slots."""
        return self.held

    # --------------------------------------------------------------- writing

    def _encode(self, data: np.ndarray) -> tuple[bytes, int]:
        # zstd returns its output buffer (sized for the worst case) shrunk in place; kept, each
        # one pins a frame-sized malloc chunk that later payloads cannot reuse, and resident memory
        # grows by about a raw frame per row. An exact-size copy lets that chunk be freed and reused.
        blob = memoryview(self._cctx.compress(data)).tobytes()
        if len(blob) >= self.frame_bytes:
            return data.tobytes(), int(RAW | FILLED)
        return blob, int(FILLED)

    def _drop(self, row: int) -> None:
        blob = self.rows[row]
        if blob is not None:
            self.held -= len(blob) + _OBJECT_BYTES
        self.rows[row] = None
        self.kind[row] = 0

    def _drop_old_key(self, group: int) -> None:
        old = self.old_keys.pop(group, None)
        if old is not None:
            self.held -= len(old[0]) + _OBJECT_BYTES

    def _group_end(self, g0: int) -> int:
        return min(g0 + GROUP, self.capacity)

    def _key_bytes(self, g0: int) -> np.ndarray | None:
        """The bytes of group g0's current key (None if it holds none), from the cache if it is there."""
        if self._key is not None and self._key[0] == g0:
            return self._key[1]
        if not self.kind[g0]:
            return None
        return self._decode_plain(self.rows[g0], int(self.kind[g0]))  # type: ignore[arg-type]

    def write(self, j: int, frame: np.ndarray) -> list[int]:
        """Store ``frame`` in row ``j`` (the ring's write position); return the rows evicted to
        stay within the budget, oldest first."""
        data = np.ascontiguousarray(frame, dtype=self.dtype).reshape(-1).view(np.uint8)
        g0 = j - j % GROUP
        end = self._group_end(g0)
        if j == g0:
            later = self.kind[j + 1 : end]
            if self.kind[j] and later.any():  # the group's older rows keep decoding against this key
                self.old_keys[g0] = (self.rows[j], int(self.kind[j]))  # type: ignore[assignment]
                self.held += len(self.rows[j]) + _OBJECT_BYTES  # type: ignore[arg-type]
                later[later != 0] |= STALE
            self._drop(j)
            blob, kind = self._encode(data)
            self._key = (j, data.copy())
        else:
            self._drop(j)
            key = self._key_bytes(g0)
            blob, kind = self._encode(data if key is None else np.bitwise_xor(data, key))
            if key is not None:  # a delta; stored raw, it is the frame itself, not the XOR
                blob, kind = (data.tobytes(), kind) if kind & RAW else (blob, kind | int(DELTA))
            if j + 1 >= end or not self.kind[j + 1] & STALE:
                self._drop_old_key(g0)  # no row decodes against the previous key any more
        self.rows[j] = blob
        self.kind[j] = kind
        self.held += len(blob) + _OBJECT_BYTES
        return self._evict_past_budget(j)

    def _evict_past_budget(self, j: int) -> list[int]:
        """Evict the oldest rows (those after ``j``, in ring order), a group's tail at a time,
        until the held bytes fit the budget again."""
        evicted: list[int] = []
        r = j + 1 if j + 1 < self.capacity else 0
        while self.held > self.budget:
            if (j - r) % self.capacity < self.protect:
                raise RuntimeError("replay compression evicted up to the newest rows; the budget floor is wrong")
            g0 = r - r % GROUP
            for row in range(r, self._group_end(g0)):
                if self.kind[row]:
                    self._drop(row)
                    evicted.append(row)
            self._drop_old_key(g0)
            if self._key is not None and self._key[0] == g0:
                self._key = None
            r = self._group_end(g0) % self.capacity
        self.evicted += len(evicted)
        return evicted

    # --------------------------------------------------------------- reading

    def _decode_plain(self, blob: bytes, kind: int) -> np.ndarray:
        """One key's (or stand-alone row's) bytes, as a flat uint8 array (encoding's key)."""
        if kind & RAW:
            return np.frombuffer(blob, np.uint8)
        return np.frombuffer(self._dctx.decompress(blob), np.uint8)

    def _scratch(self, slot: int, n: int) -> np.ndarray:
        """A reused (n, frame_bytes) array: fresh batch-sized arrays cost page faults on every batch."""
        if self._scratches[slot].shape[0] < n:
            self._scratches[slot] = np.empty((n, self.frame_bytes), np.uint8)
        return self._scratches[slot][:n]

    def _key_frames(self, keys: list[int], out: np.ndarray, decoded_at: dict[int, int]) -> np.ndarray:
        """Frames of keys numbered ``row * 2`` (+ 1: the group's previous key), after a zero frame:
        copied from ``out`` where the batch decoded the key row itself, decoded otherwise."""
        need = [key for key in keys if key not in decoded_at]
        found = [self.old_keys[key >> 1] if key & 1 else (self.rows[key >> 1], int(self.kind[key >> 1])) for key in need]
        blobs, kinds = [blob for blob, _ in found], [kind for _, kind in found]
        fresh = iter(decode_many(self._dctx.decompress, self.frame_bytes, blobs, kinds))
        frames = np.zeros((len(keys) + 1, self.frame_bytes), np.uint8)
        for n, key in enumerate(keys, 1):
            frames[n] = out[decoded_at[key]] if key in decoded_at else next(fresh)
        return frames

    def take(self, rows: np.ndarray, scratch: bool = False) -> np.ndarray:
        """Frames of ``rows`` (any int array shape): every row decompressed into one array, then
        one XOR with its key's frame (a zero frame for rows that are not deltas); each key a
        batch needs is decoded once, or not at all where the batch holds the key row itself.

        :param scratch: decode into arrays this store reuses (the result is valid until the next
            take), for callers that copy the frames out at once (into stacks)."""
        flat = np.asarray(rows, dtype=np.int64).reshape(-1)
        kinds = self.kind[flat]
        delta = (kinds & DELTA) != 0
        out = decode_many(self._dctx.decompress, self.frame_bytes, [self.rows[row] for row in flat.tolist()],
                          (kinds & ~STALE & ~DELTA).tolist(), self._scratch(0, flat.size) if scratch else None)
        if delta.any():
            # A key is its group's first row, or (STALE) the group's previous key: number them.
            key_ids = np.where(delta, (flat - flat % GROUP) * 2 + ((kinds & STALE) != 0), -1)
            unique_keys, key_index = np.unique(key_ids, return_inverse=True)  # -1 first, if any
            key_rows = (flat % GROUP == 0) & (kinds != 0) & ~delta
            decoded_at = dict(zip((flat[key_rows] * 2).tolist(), np.flatnonzero(key_rows).tolist()))
            keys = self._key_frames(unique_keys[unique_keys >= 0].tolist(), out, decoded_at)
            which = key_index + (unique_keys[0] >= 0)
            np.bitwise_xor(out, np.take(keys, which, axis=0, out=self._scratch(1, flat.size)) if scratch else keys[which],
                           out=out)
        return out.view(self.dtype).reshape(*np.shape(rows), *self.shape[1:])

    # ----------------------------------------------------------- checkpoints

    def adopt(self, rows: list[bytes | None], kind: np.ndarray, old_keys: dict[int, tuple[bytes, int]]) -> None:
        """Hold these rows (from a checked checkpoint: see packed_state.py) instead of the current ones."""
        self.rows, self.kind, self.old_keys = rows, kind, old_keys
        self._key = None
        self.held = self.capacity * ROW_BYTES + sum(len(b) + _OBJECT_BYTES for b in rows if b is not None)
        self.held += sum(len(b) + _OBJECT_BYTES for b, _ in old_keys.values())

    def decoded(self) -> np.ndarray:
        """Every row's frame, decoded into one (capacity, *frame) array, a few MiB at a time."""
        out = np.empty(self.shape, self.dtype)
        for lo in range(0, self.capacity, 4096):
            out[lo : lo + 4096] = self.take(np.arange(lo, min(lo + 4096, self.capacity)))
        return out
