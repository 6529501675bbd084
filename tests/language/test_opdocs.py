"""`help(pl.<op>)` shows the op's own doc: the stubs, the op table and the implementations share one text."""
from __future__ import annotations

import inspect
import pydoc

import pytest

import pypto.language as pl
import pypto.language.distributed as pld
from pypto_rt.language import surface
from pypto_rt.language.ops import Namespace, OpStub, spelled
from pypto_rt.ops import OPS
from pypto_rt.ops.opdef import OPDEFS


def _stubs():
    """Every op callable of the user surface: pl.X, pl.tensor.X, pl.tile.X, pl.system.X, ..., pld.X, pld.tile.X."""
    found = {}
    for module in (pl, pld):
        for name in dir(module):
            value = getattr(module, name)
            members = [getattr(value, m) for m in dir(value)] if isinstance(value, Namespace) else [value]
            found.update({m.qualname: m for m in members if isinstance(m, OpStub)})
    return found


STUBS = _stubs()


def test_the_surface_lists_every_stub_the_test_checks():
    assert surface.qualified_names() <= set(STUBS)
    assert {"add", "tensor.add", "tile.add", "tile.row_sum", "pld.allreduce", "pld.system.notify"} <= set(STUBS)


@pytest.mark.parametrize("qualname", sorted(STUBS))
def test_every_op_stub_has_its_own_doc(qualname):
    doc = inspect.getdoc(STUBS[qualname])
    base = qualname.rsplit(".", 1)[-1]
    assert doc, f"{spelled(qualname)} has no doc"
    # the doc is about this op: its header spells the op (or lists it as an alias), not a wrapper class
    header = doc.split("\n\n")[0]
    assert f"{spelled(qualname)}(" in header or f"pl.{base}(" in header or f"(also {spelled(qualname)})" in header


def test_op_table_implementation_and_stub_docs_agree():
    for name, d in OPDEFS.items():
        assert d.doc and OPS[name].__doc__ == d.doc, name
        if name in STUBS:
            assert STUBS[name].__doc__ == d.doc, name


def test_different_ops_have_different_docs():
    assert len({pl.add.__doc__, pl.sub.__doc__, pl.adds.__doc__, pl.tile.add.__doc__}) == 3
    assert pl.tile.add.__doc__ == pl.add.__doc__


def test_help_of_pl_add_says_what_it_does():
    text = pydoc.render_doc(pl.add, renderer=pydoc.plaintext)
    assert "pl.add(lhs, rhs)" in text and "Elementwise lhs + rhs" in text
    assert "broadcast" in text and "promotion" in text
    assert "pl.row_sum(input, tmp_tile=None)" in pydoc.render_doc(pl.tile.row_sum, renderer=pydoc.plaintext)


def test_other_public_callables_of_the_surface_have_docs():
    for module in (pl, pld):
        for name in getattr(module, "__all__", dir(module)):
            value = getattr(module, name)
            if callable(value) and not inspect.isclass(value) and not isinstance(value, OpStub):
                assert inspect.getdoc(value), f"{module.__name__}.{name}"
