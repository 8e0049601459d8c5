"""The tensor arena a policy needs on TFLite Micro, measured by bisection in a child process, and the
summary of what TFLM costs that the run and the report show.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from compress_dqn.deploy.micro.model import (
    ModelInfo,
    failure_reason,
    generous_arena,
    inspect_model,
    invoke_zeros,
    native_stderr,
    new_interpreter,
    refuse_missing,
    tflm_runtime,
)
from compress_dqn.deploy.micro.uint8_input import runnable_model
from compress_dqn.deploy.micro_figures import TFLM_RUNTIME_FLASH, MicroFigures
from compress_dqn.deploy.tflite.reader import read_tflite
from compress_dqn.errors import UserError

RAM_BUDGETS = {"32KB": 32 * 1024, "256KB": 256 * 1024}
ARENA_MARGIN = 0.25
"""Margin on the measured arena: 25%, at least 1 KiB (kernel scratch buffers differ per port)."""
ARENA_MARGIN_MIN = 1024
FITS_COUNTS = ("fits[budget]: the tensor arena with margin fits RAM of that size; fits_flash[budget]: the model "
               "array plus the TFLM runtime's high estimate fits flash of that size")


class ArenaProbe:
    """Tries arena sizes in a child process: TFLM can crash (not fail) on an arena a little too small.

    One worker takes sizes on stdin and answers 1 or 0 per size; a crash or a hang counts as 0
    and a fresh worker takes the next size, so the caller never dies with it.
    """

    TIMEOUT_S = 60.0

    def __init__(self, data: bytes, n_inputs: int) -> None:
        self._n_inputs = n_inputs
        self._file = tempfile.NamedTemporaryFile(suffix=".tflite", delete=False)
        self._file.write(data)
        self._file.close()
        self._proc: Any = None

    def _start(self) -> None:
        code = "from compress_dqn.deploy.micro.arena import probe_worker; probe_worker()"
        package_root = str(Path(__file__).resolve().parents[3])  # the repository root: importable even when not installed
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)}
        self._proc = subprocess.Popen([sys.executable, "-c", code, self._file.name, str(self._n_inputs)], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      text=True, bufsize=1)

    def runs(self, arena: int) -> bool:
        import select

        if self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            self._proc.stdin.write(f"{int(arena)}\n")
            self._proc.stdin.flush()
            ready, _, _ = select.select([self._proc.stdout], [], [], self.TIMEOUT_S)
            answer = self._proc.stdout.readline() if ready else ""
        except (BrokenPipeError, OSError):
            answer = ""
        if answer.strip() in ("0", "1"):
            return answer.strip() == "1"
        self._stop()  # crashed or hung on this size
        return False

    def _stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.kill()
            self._proc.wait()
            for stream in (self._proc.stdin, self._proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._proc = None

    def close(self) -> None:
        self._stop()
        with contextlib.suppress(OSError):
            os.unlink(self._file.name)


def probe_worker() -> None:
    """Child side of ArenaProbe: argv[1] is the model file, argv[2] its input count; one size per line."""
    runtime = tflm_runtime()
    data, n_inputs = Path(sys.argv[1]).read_bytes(), int(sys.argv[2])
    for line in sys.stdin:
        try:
            invoke_zeros(runtime.Interpreter.from_bytes(data, arena_size=int(line)), n_inputs)
            ok = True
        except Exception:
            ok = False
        print(1 if ok else 0, flush=True)


class ArenaSize(NamedTuple):
    """A measured tensor arena: the smallest that runs, and the allocation recorder's total (a lower bound)."""

    arena_bytes: int
    recorded_bytes: int


def measure_arena(data: bytes, label: str = "<bytes>", info: ModelInfo | None = None) -> ArenaSize:
    """The smallest tensor arena with which TFLM allocates and invokes the model, in bytes.

    The allocation recorder's total is a lower bound (it leaves out the allocator's own objects and
    temporaries freed during Prepare); bisection from there to a size that works gives the number
    a device build actually needs with the same kernels.
    """
    info = info or inspect_model(data, label)
    refuse_missing(info, label)
    interp = new_interpreter(data, generous_arena(data), label)
    with native_stderr() as lines:
        try:
            invoke_zeros(interp, info.n_inputs)
            failed = None
        except Exception as exc:
            failed = exc
        if failed is None:
            interp.print_allocations()
    if failed is not None:
        raise UserError(f"{label}: {failure_reason(lines, failed)}")
    recorded = next((int(m.group(1)) for line in lines if (m := re.search(r"allocation total (\d+) bytes", line))), 0)
    probe = ArenaProbe(data, info.n_inputs)
    try:
        low, step = max(recorded, 1), 256
        if probe.runs(low):
            return ArenaSize(arena_bytes=low, recorded_bytes=recorded)
        high = low + step
        while not probe.runs(high):  # the recorder's total plus a little, doubling
            low, step = high, step * 2
            high = min(low + step, generous_arena(data))
            if low >= generous_arena(data):
                raise UserError(f"{label}: TFLite Micro did not run it in any arena up to {low} bytes")
        while high - low > 1:  # invariant: low fails, high works
            mid = (low + high) // 2
            low, high = (low, mid) if probe.runs(mid) else (mid, high)
    finally:
        probe.close()
    return ArenaSize(arena_bytes=high, recorded_bytes=recorded)


def with_margin(arena_bytes: int) -> int:
    """The arena to allocate on a device: measured + 25% (at least 1 KiB), a multiple of 16."""
    padded = arena_bytes + max(math.ceil(arena_bytes * ARENA_MARGIN), ARENA_MARGIN_MIN)
    return -(-padded // 16) * 16


def flash_fits(model_bytes: int) -> dict[str, bool]:
    """Whether the model array plus TFLM's own code (its docs' high estimate) fits each flash budget."""
    return {budget: model_bytes + TFLM_RUNTIME_FLASH.high_bytes <= size for budget, size in RAM_BUDGETS.items()}


def micro_summary(tflite_path_or_bytes: str | Path | bytes) -> MicroFigures:
    """Whether TFLM runs this policy and what it costs; never raises for a model it cannot run.

    arena_bytes is measured (None when it does not run), flash_bytes is the model array's length,
    fits compares the arena with margin against the RAM budgets and fits_flash the model array plus
    the runtime's high estimate against flash of those sizes; reason says why it does not run. A raw
    uint8 observation's CAST is rewritten first, as `export --target micro` does (uint8_input.py).
    """
    failed = partial(MicroFigures, runs=False, arena_bytes=None, arena_bytes_with_margin=None, flash_bytes=0, ops=[],
                     runtime_flash_estimate=TFLM_RUNTIME_FLASH, fits={budget: False for budget in RAM_BUDGETS},
                     fits_flash={budget: False for budget in RAM_BUDGETS}, fits_counts=FITS_COUNTS)
    data, ops = b"", []
    try:
        data, label = read_tflite(tflite_path_or_bytes)
        info = inspect_model(data, label)
        ops = info.ops
        data, info = runnable_model(data, info, label)
        ops = info.ops
        arena = measure_arena(data, label, info).arena_bytes
    except UserError as exc:
        return failed(flash_bytes=len(data), ops=ops, reason=str(exc))
    except Exception as exc:  # a report must not die on one artifact: say what went wrong instead
        reason = f"measuring it failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        return failed(flash_bytes=len(data), ops=ops, reason=reason)
    padded = with_margin(arena)
    return MicroFigures(runs=True, arena_bytes=arena, arena_bytes_with_margin=padded, flash_bytes=len(data), ops=ops,
                        reason=None, runtime_flash_estimate=TFLM_RUNTIME_FLASH,
                        fits={budget: padded <= size for budget, size in RAM_BUDGETS.items()},
                        fits_flash=flash_fits(len(data)), fits_counts=FITS_COUNTS)
