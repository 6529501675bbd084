"""Rank output: bytes read from a rank's stdout or stderr pipe go raw to its log file and, line by line with a
`[rank N] ` prefix, to the launcher's own stream of the same kind.

Whole lines only reach the terminal, so lines of different ranks never interleave mid-line; a last line without
a newline is flushed when the stream ends. The last TAIL_BYTES stay in `tail`: a rank that dies without an error
record (a C++ abort, say) often said why there.
"""
from __future__ import annotations

import sys
from typing import BinaryIO

TAIL_BYTES = 8192


class RankStream:
    """One stream ("stdout" or "stderr") of one rank."""

    def __init__(self, rank: int, kind: str, echo: bool, log: BinaryIO | None):
        self.prefix = f"[rank {rank}] "
        self.kind = kind
        self.echo = echo
        self.log = log
        self._partial = b""
        self.tail = b""

    def feed(self, data: bytes) -> None:
        self.tail = (self.tail + data)[-TAIL_BYTES:]
        if self.log is not None:
            self.log.write(data)
            self.log.flush()
        if not self.echo:
            return
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        if lines:
            self._write(lines)

    def close(self) -> None:
        """The stream ended: flush a last unterminated line, close the log."""
        if self.echo and self._partial:
            self._write([self._partial])
        self._partial = b""
        if self.log is not None:
            self.log.close()
            self.log = None

    def _write(self, lines: list[bytes]) -> None:
        out = sys.stdout if self.kind == "stdout" else sys.stderr  # looked up now: callers may redirect them
        text = "".join(f"{self.prefix}{line.decode('utf-8', 'replace').rstrip(chr(13))}\n" for line in lines)
        try:
            out.write(text)
            out.flush()
        except (BrokenPipeError, ValueError):  # the terminal went away: keep the logs, drop the echo
            self.echo = False
