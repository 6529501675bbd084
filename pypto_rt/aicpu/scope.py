"""A scope of an engine's run: the tasks submitted inside it keep their ring slots until it closes. Imports nothing
from pypto_rt."""
from __future__ import annotations

from .task import Task


class RingScope:
    """Tasks submitted in a scope hold their ring slot at least until it closes. A context manager rather than a
    generator one: the host opens one per loop iteration (the same object, entered again for each)."""
    __slots__ = ("name", "span", "manual", "tasks", "engine")

    def __init__(self, name: str, span, manual: bool, engine=None):
        self.name, self.span, self.manual, self.engine = name, span, manual, engine
        self.tasks: list[Task] = []

    def __enter__(self):
        self.engine._check_usable()
        self.engine._scopes.append(self)
        return self

    def __exit__(self, *exc) -> None:
        engine = self.engine
        scopes = engine._scopes
        if scopes[-1] is self:
            scopes.pop()
        else:
            scopes.remove(self)
        tasks = self.tasks
        if not tasks:
            return
        if engine._live:
            with engine._lock:
                engine._close_scope(self)
        else:   # nothing in flight, so no worker touches the ring (see `_settle`)
            engine._close_scope(self)
