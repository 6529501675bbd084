"""Style warnings the front end finds: code the real compiler accepts that the style guide places elsewhere.

The front end records them (`FunctionIR.notes`); whoever compiles or first runs a kernel function calls
`warn_once`. Each note is given once per kernel function and process, so a recompilation (a traced
variant, a load from the disk cache) or a second call never repeats it.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

from pypto_rt.errors import StyleWarning


@dataclass(frozen=True)
class StyleNote:
    """One style warning, at the user's file:line."""
    message: str
    file: str
    line: int


def warn_once(kernel, notes) -> None:
    """Give each of `notes` as a StyleWarning at its line, unless `kernel` gave it before in this process."""
    if not notes:
        return
    given = kernel.state.style_notes_given
    for note in notes:
        if note not in given:
            given.add(note)
            warnings.warn_explicit(note.message, StyleWarning, note.file, note.line)
