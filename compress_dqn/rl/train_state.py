"""Training progress that must survive a restart: the loops' counters and the checkpoint directories.

A checkpoint is a directory written under a temporary name and then renamed, so a crash at any
moment leaves the previous complete one in place; `latest` names the newest.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping

from pydantic import JsonValue

from compress_dqn.errors import UserError, WriteRefused
from compress_dqn.fileio import refused_writes, write_text_atomic


@dataclass
class TrainState:
    """Every counter a training loop advances, in one place so a checkpoint saves them as one.

    The keys of state_dict() are the counters' names in a checkpoint's state.json (JSON, no pickle).
    """

    step: int = 0
    """Environment steps taken (for distillation, which takes none: gradient steps)."""
    gradient_step: int = 0
    episodes: int = 0
    pending_target_updates: int = 0
    """Target updates due but not applied yet: they are applied, in closed form, before the next phase."""
    next_checkpoint: int = 0
    next_eval: int | None = None
    best_return: float | None = None
    best_step: int | None = None
    episode_returns: list[float] = field(default_factory=list)

    def state_dict(self) -> dict[str, JsonValue]:
        """The counters as plain JSON-able values (a copy)."""
        return asdict(self)

    def load_state_dict(self, state: Mapping[str, JsonValue]) -> None:
        """Restore counters saved by state_dict(); other keys (a checkpoint's RNG states) are ignored."""
        for counter in fields(self):
            setattr(self, counter.name, state[counter.name])


def latest_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return None
    path = ckpt_dir / pointer.read_text().strip()
    return path if (path / "state.json").exists() else None


def write_checkpoint_dir(ckpt_dir: Path, name: str, write: Callable[[Path], None]) -> Path:
    """Have `write` fill a new directory, then make it the latest checkpoint `name` and drop the previous one.

    A full or read-only disk is one WriteRefused line that names the checkpoint (not its temporary)
    and says the previous one is intact (it is: it goes only after the new one is complete).
    """
    tmp = ckpt_dir / f".tmp-{name}-{os.getpid()}"
    try:
        with refused_writes(ckpt_dir / name):
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            write(tmp)
    except (WriteRefused, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays as it was
        previous = latest_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
        kept = f"the last good checkpoint {previous.name} is intact" if previous else "no checkpoint was complete"
        if isinstance(exc, WriteRefused):
            raise WriteRefused(exc.code, ckpt_dir / name, f" ({kept})") from exc
        raise UserError(f"cannot write checkpoint {name} in {ckpt_dir} ({exc.strerror or exc}); {kept}; "
                        "rerun the same command to resume") from None
    final = ckpt_dir / name
    with refused_writes(final):
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    previous = latest_checkpoint(ckpt_dir)
    write_text_atomic(ckpt_dir / "latest", name)
    if previous is not None and previous != final:
        shutil.rmtree(previous, ignore_errors=True)
    return final
