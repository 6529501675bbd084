"""Rank 0's progress display: one line rewritten in place on a terminal, a plain line every `interval_s` seconds
otherwise (a pipe, a log file, `pypto-launch`'s prefixed rank output). Other ranks print nothing."""
from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    def __init__(self, enabled: bool, interval_s: float = 2.0, stream: TextIO | None = None):
        self.enabled, self.interval_s = enabled, interval_s
        self.stream = stream or sys.stdout
        self.in_place = enabled and self.stream.isatty()
        self._last = None          # the elapsed seconds of the last line written
        self._line = ""
        self._written = ""         # the line on screen (or last printed)

    def update(self, step: int, finished: int, total: int, tokens: int, elapsed_s: float) -> None:
        if not self.enabled:
            return
        rate = tokens / elapsed_s if elapsed_s > 0 else 0.0
        self._line = (f"[serve] step {step:5d}  requests done {finished:3d}/{total}  "
                      f"tokens out {tokens:6d}  {rate:7.1f} tok/s  {elapsed_s:6.1f} s")
        due = self._last is None or elapsed_s - self._last >= (0.2 if self.in_place else self.interval_s)
        if due:
            self._write()
            self._last = elapsed_s

    def close(self) -> None:
        """The last state, ending the in-place line."""
        if self.enabled and self._line and self._line != self._written:
            self._write()
        if self.in_place and self._written:
            self.stream.write("\n")
            self.stream.flush()

    def _write(self) -> None:
        if self.in_place:
            self.stream.write("\r" + self._line + "\x1b[K")
        else:
            self.stream.write(self._line + "\n")
        self.stream.flush()
        self._written = self._line
