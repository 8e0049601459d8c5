"""Which ring rows are sampleable transitions: flags, episode starts, n-step chains and sampling.

One uint8 flag byte per row carries it all. Row ``i`` is a sampleable transition start (VALID)
only while row ``(i + 1) % capacity`` still holds its next observation; writing a row withdraws
VALID from every transition whose observations it overwrites, so sampling never needs to know
how the rows were written.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

__all__ = ["MIN_VALID_FRACTION", "START", "TERMINATED", "TRUNCATED", "TransitionIndex", "VALID"]

# Bits of the per-row ``flags`` byte.
VALID = np.uint8(1)  # row starts a transition; the next row is its next obs
TERMINATED = np.uint8(2)  # the transition ended the episode for real
TRUNCATED = np.uint8(4)  # the episode was cut off (time limit); still bootstraps
START = np.uint8(8)  # row begins a stored history: stacks do not reach behind it

_NOT_VALID = np.uint8(~VALID & 0xFF)

# Below this share of VALID rows, rejection sampling wastes too many draws and
# sample enumerates the valid rows instead.  Normally the share is about 50% or
# more, so the fallback is a safety net.
MIN_VALID_FRACTION = 0.25


def next_rows(idx: np.ndarray, capacity: int) -> np.ndarray:
    """``idx + 1`` around the ring (a new array)."""
    nxt = idx + 1
    nxt[nxt == capacity] = 0
    return nxt


class TransitionIndex:
    """VALID/START/end flags of the ring's rows, the count of VALID rows and the sampling generator.

    :param flags: the ring's per-row uint8 array, shared (the index writes into it).
    :param frame_stack: frames per stack; a written row also holds the oldest frame of the next
        ``frame_stack - 1`` rows' stacks.
    :param seed: seed of the sampling generator.
    """

    state_keys = ("num_transitions", "episode_open", "last_row", "rng_state")  # frame_stack: optional

    def __init__(self, flags: np.ndarray, frame_stack: int, seed: int | np.random.SeedSequence) -> None:
        self.flags = flags
        self.capacity = int(flags.shape[0])
        self.k = frame_stack
        self.num_valid = 0  # VALID rows, kept up to date on every write
        self.episode_open = False  # last add did not end its episode
        self.last_row = -1  # row holding the last add's next_obs
        self.rng = np.random.default_rng(seed)

    def overwrite(self, j: int, start: bool) -> None:
        """Flag row ``j`` as about to be overwritten (START if it begins a history).

        Overwriting row j destroys the transition starting at j (its obs is gone), the one
        starting at j-1 (its next obs is gone) and, with frame stacks, those starting at
        j+1 .. j+k-1 whose stack reaches back to j (none past a START row).  When j is written
        as the next obs of j-1 in the same add, the caller marks j-1 again afterwards.
        """
        flags = self.flags
        if flags[j] & VALID:
            self.num_valid -= 1
        prev = j - 1 if j > 0 else self.capacity - 1
        if flags[prev] & VALID:
            flags[prev] &= _NOT_VALID
            self.num_valid -= 1
        for m in range(1, self.k):  # capacity > k, so these rows are not j or j-1
            r = j + m if j + m < self.capacity else j + m - self.capacity
            f = flags[r]
            if f & START:
                break
            if f & VALID:
                flags[r] = f & _NOT_VALID
                self.num_valid -= 1
        flags[j] = START if start else 0

    def mark(self, row: int, next_row: int, terminated: bool, truncated: bool) -> None:
        """Make ``row`` a VALID transition start whose next observation is ``next_row``."""
        flags = VALID
        if terminated:
            flags |= TERMINATED
        if truncated:
            flags |= TRUNCATED
        self.flags[row] = (self.flags[row] & START) | flags
        self.num_valid += 1
        self.last_row = next_row
        self.episode_open = not (terminated or truncated)

    def sample(self, n: int, size: int) -> np.ndarray:
        """``n`` VALID row indices among the first ``size`` rows, uniform with replacement.

        Rejection sampling avoids building the list of valid rows on every call; VALID rows are
        normally the large majority.
        """
        out = np.empty(n, dtype=np.int64)
        filled = 0
        fraction = self.num_valid / size
        while filled < n:
            need = n - filled
            if fraction < MIN_VALID_FRACTION:
                valid = np.flatnonzero(self.flags[:size] & VALID)
                out[filled:] = valid[self.rng.integers(0, valid.size, size=need)]
                break
            # Draw ~10% more than the expected requirement so one round is
            # usually enough; keeping the first `need` valid draws stays uniform.
            draw = int(need / fraction * 1.1) + 8
            idx = self.rng.integers(0, size, size=draw)
            keep = idx[(self.flags[idx] & VALID) != 0][:need]
            out[filled : filled + keep.size] = keep
            filled += keep.size
        return out

    def n_step(
        self, idx: np.ndarray, rewards: np.ndarray, n_steps: int, gamma: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Walk up to ``n_steps`` transitions from each VALID row, stopping after an episode end
        or at the newest stored transition.

        :returns: the last row of each chain, its discounted reward sum (float64), gamma**m for
            its m steps and whether the episode terminated within them.
        """
        cur = idx.copy()
        total = np.zeros(idx.shape, np.float64)
        discount = np.ones(idx.shape, np.float64)
        terminated = np.zeros(idx.shape, bool)
        alive = np.ones(idx.shape, bool)
        for step in range(n_steps):
            if step:  # go on where the last row neither ended the episode nor was the newest
                nxt = next_rows(cur, self.capacity)
                alive &= (self.flags[nxt] & VALID) != 0
                cur = np.where(alive, nxt, cur)
            flags = self.flags[cur]
            total += np.where(alive, discount * rewards[cur], 0.0)
            discount = np.where(alive, discount * gamma, discount)
            terminated |= alive & ((flags & TERMINATED) != 0)
            alive &= (flags & (TERMINATED | TRUNCATED)) == 0
        return cur, total, discount, terminated

    def state_dict(self) -> dict[str, np.ndarray]:
        """Counters, frame_stack and the generator state (JSON in a 0-d unicode array, not a pickle)."""
        return {
            "num_transitions": np.array(self.num_valid, dtype=np.int64),
            "episode_open": np.array(self.episode_open, dtype=np.bool_),
            "last_row": np.array(self.last_row, dtype=np.int64),
            "frame_stack": np.array(self.k, dtype=np.int64),
            "rng_state": np.array(json.dumps(self.rng.bit_generator.state)),
        }

    def check_frame_stack(self, state: Mapping[str, np.ndarray]) -> None:
        """Raise ValueError unless ``state`` was saved with this frame_stack (1 if it has none:
        saved before frame stacking existed). First, as a mismatch also garbles every array."""
        saved_k = int(state["frame_stack"]) if "frame_stack" in state else 1
        if saved_k != self.k:
            raise ValueError(
                f"replay state was saved with frame_stack={saved_k} but this buffer has "
                f"frame_stack={self.k}; build the buffer with frame_stack={saved_k}"
            )

    def check_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Raise ValueError unless ``state``'s counters agree with its flags and this capacity."""
        last_row = int(state["last_row"])
        if not -1 <= last_row < self.capacity:
            raise ValueError(f"replay state has last_row {last_row} outside capacity {self.capacity}")
        num_valid = int(state["num_transitions"])
        counted = int(np.count_nonzero(np.asarray(state["flags"]) & VALID))
        if counted != num_valid:
            raise ValueError(f"replay state says {num_valid} transitions but its flags hold {counted}")
        json.loads(str(np.asarray(state["rng_state"])[()]))

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore counters and generator from a checked ``state`` (the flags come with the ring)."""
        self.check_state(state)
        self.rng.bit_generator.state = json.loads(str(np.asarray(state["rng_state"])[()]))
        self.num_valid = int(state["num_transitions"])
        self.episode_open = bool(state["episode_open"])
        self.last_row = int(state["last_row"])
