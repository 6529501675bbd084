"""Op stubs: callables that forward `pl.<op>(...)` to the active executor under the op's qualified name."""
from __future__ import annotations

from pypto_rt.errors import UnknownOpError, user_span
from pypto_rt.language import _runtime
from pypto_rt.language.enums import MaskPattern
from pypto_rt.language.opdocs import doc_of


class OpStub:
    # `pl.<name>`: runs on the active executor; outside a kernel it says so. Each stub carries its op's own doc
    # (language/opdocs.py) as `__doc__`, so `help(pl.add)` describes pl.add (hence no class docstring here).
    __slots__ = ("qualname", "__name__", "__qualname__", "__doc__")

    def __init__(self, qualname: str):
        self.qualname = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]
        self.__qualname__ = qualname
        self.__doc__ = doc_of(qualname)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.__doc__ = OpStub.__dict__["__doc__"]   # a class-level doc (even None) would hide each stub's own

    def __call__(self, *args, **kwargs):
        return _runtime.current(spelled(self.qualname)).call_op(self.qualname, args, kwargs)

    def __repr__(self) -> str:
        return f"<{spelled(self.qualname)}>"


def spelled(qualname: str) -> str:
    """How users write an op: `pl.tensor.add`, and `pld.system.notify` for the distributed ones."""
    return qualname if qualname.startswith("pld.") else f"pl.{qualname}"


class Namespace:
    """`pl.tensor`, `pl.tile`, `pl.system`, ...: stubs for the names the surface lists, errors otherwise."""

    def __init__(self, name: str, members: set[str], extra: dict | None = None):
        self._name = name
        self._members = frozenset(members)
        for m in members:
            setattr(self, m, OpStub(f"{name}.{m}"))
        for k, v in (extra or {}).items():
            setattr(self, k, v)

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        raise UnknownOpError(f"unknown op {spelled(self._name)}.{item}", user_span(2),
                             f"{spelled(self._name)} has: {', '.join(sorted(self._members))}")

    def __dir__(self):
        return sorted(self._members)


def make_namespaces(table: dict[str, set[str]]) -> dict[str, Namespace]:
    extra = {"tile": {"MaskPattern": MaskPattern}}
    return {ns: Namespace(ns, members, extra.get(ns)) for ns, members in table.items()}
