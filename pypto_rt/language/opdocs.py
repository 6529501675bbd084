"""The user-facing doc of every `pl` op (filled in by the next commit)."""
from __future__ import annotations

DOCS: dict[str, str] = {}


def doc_of(qualname: str) -> str:
    """The doc of the op `qualname` ("" when none is written)."""
    return DOCS.get(qualname, "")
