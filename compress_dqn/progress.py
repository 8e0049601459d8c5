"""Training progress: a rich bar on a terminal, plain periodic lines otherwise (CI logs, pipes)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """Shows steps/s and the recent return; quiet=True prints nothing (tests)."""

    def __init__(self, label: str, total: int, start: int = 0, quiet: bool = False, stream: TextIO | None = None):
        self.label, self.total, self.quiet = label, total, quiet
        self.stream = stream or sys.stderr
        self._start_step, self._t0 = start, time.perf_counter()
        self._next_line = start
        self._bar = None
        self._task = None
        if not quiet and self.stream.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, TimeRemainingColumn

            self._bar = RichProgress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[rate]:>7.0f} steps/s  return {task.fields[ret]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, completed=start, rate=0.0, ret="-")

    def rate(self, step: int) -> float:
        elapsed = time.perf_counter() - self._t0
        return (step - self._start_step) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, recent_return: float | None) -> None:
        if self.quiet:
            return
        ret = "-" if recent_return is None else f"{recent_return:.1f}"
        if self._bar is not None:
            self._bar.update(self._task, completed=step, rate=self.rate(step), ret=ret)
        elif step >= self._next_line or step >= self.total:
            print(f"[{self.label}] step {step}/{self.total}  {self.rate(step):.0f} steps/s  recent return {ret}",
                  file=self.stream, flush=True)
            self._next_line = step + max(1, self.total // 10)

    def message(self, text: str) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
