"""Progress of long work on stderr: a bar on a terminal, a plain line per item elsewhere.

A :class:`Progress` counts items done out of a known total. On a terminal it redraws one
line in place (label, bar, done/total, rate, ETA) and prints each item's message above it;
written to a file or a pipe (a CI log, ``2> log``) it prints one plain line per item, with
the same figures, so the log reads top to bottom. ``MLX_AGENT_PROGRESS=lines`` or ``=off``
overrides the choice.

Not promised: thread safety (callers report from one thread), or a bar that survives other
writers on the same terminal line.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, TextIO

ENV = "MLX_AGENT_PROGRESS"  # bar | lines | off; default: bar on a terminal, else lines
BAR_WIDTH = 24


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _mode(stream: TextIO) -> str:
    mode = os.environ.get(ENV, "").strip().lower()
    if mode in ("bar", "lines", "off"):
        return mode
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # a closed or unusual stream
        return "lines"


class Progress:
    """``total`` items of work called ``label``; :meth:`advance` once per item done."""

    def __init__(self, total: int, label: str, *, stream: TextIO | None = None,
                 unit: str = "it", clock: Callable[[], float] = time.monotonic):
        if total < 0:
            raise ValueError(f"a total of work must be >= 0, got {total}")
        self.total, self.label, self.unit = total, label, unit
        self.stream = stream if stream is not None else sys.stderr
        self.mode = _mode(self.stream)
        self.clock = clock
        self.start = clock()
        self.done = 0
        self._drawn = False

    def __enter__(self) -> "Progress":
        if self.mode == "bar":
            self._draw()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def figures(self) -> str:
        """``3/10 30% 1.2 it/s ETA 0:06`` (rate and ETA once an item is done)."""
        elapsed = max(self.clock() - self.start, 1e-9)
        pct = f" {self.done / self.total:.0%}" if self.total else ""
        out = f"{self.done}/{self.total}{pct}"
        if self.done:
            rate = self.done / elapsed
            shown = f"{rate:.2f} {self.unit}/s" if rate >= 1 else f"{1 / rate:.1f} s/{self.unit}"
            eta = (self.total - self.done) / rate
            out += f" {shown} ETA {_duration(eta)}" if self.done < self.total else \
                f" {shown} in {_duration(elapsed)}"
        return out

    def advance(self, message: str = "", n: int = 1) -> None:
        """``n`` more items done; ``message`` says what the last one was."""
        self.done = min(self.done + n, self.total) if self.total else self.done + n
        if self.mode == "lines":
            tail = f": {message}" if message else ""
            self._write(f"{self.label} {self.figures()}{tail}\n")
        elif self.mode == "bar":
            if message:
                self._write(f"\r\x1b[K{message}\n")
            self._draw()

    def _draw(self) -> None:
        filled = int(BAR_WIDTH * self.done / self.total) if self.total else 0
        bar = "█" * filled + "░" * (BAR_WIDTH - filled)
        self._write(f"\r\x1b[K{self.label} {bar} {self.figures()}")
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (a terminal's next output starts on a line of its own)."""
        if self._drawn:
            self._write("\n")
            self._drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe must not end the work it reports on
            self.mode = "off"
