"""The op table: every op's OpDef, the facts the compiler and the host read from it, and their agreement with the
implementation they are declared beside."""
from __future__ import annotations

import inspect

import pytest

from pypto_rt.ops import OPS
from pypto_rt.ops.opdef import ANY_DIM, COLS, NO_DIM, OPDEFS, ROWS, OpDef, Shape, names_where, opdef
from pypto_rt.ops.registry import IN_PLACE_TARGETS


def _params(name: str) -> list[str]:
    return list(inspect.signature(OPS[name]).parameters)


def test_every_registered_name_has_the_opdef_of_its_op():
    assert set(OPDEFS) == set(OPS)
    for name, d in OPDEFS.items():
        assert name in d.names
        assert all(OPS[other] is OPS[name] and OPDEFS[other] is d for other in d.names)


@pytest.mark.parametrize("name", sorted(names_where(lambda d: d.shape_arg or d.offset_arg)))
def test_shape_and_offset_arguments_name_the_implementations_parameters(name):
    d = opdef(name)
    for position, keyword in filter(None, (d.shape_arg, d.offset_arg)):
        assert _params(name)[position] == keyword


@pytest.mark.parametrize("name", sorted(IN_PLACE_TARGETS))
def test_in_place_targets_are_parameters_of_the_op(name):
    assert IN_PLACE_TARGETS[name] == opdef(name).writes in _params(name)


def test_non_operand_keywords_are_parameters_of_the_op():
    for name in names_where(lambda d: d.non_operands):
        assert opdef(name).non_operands <= set(_params(name)), name


def test_what_the_compiler_reads_about_views_and_writes():
    assemble = opdef("tensor.assemble")
    assert (assemble.offset_arg, assemble.writes, assemble.shape) == ((2, "offset"), "target", Shape.FIRST)
    load = opdef("tile.load")
    assert (load.shape, load.shape_arg, load.offset_arg) == (Shape.FROM_ARG, (2, "shapes"), (1, "offsets"))
    assert opdef("slice").is_view and opdef("reshape").is_view and not opdef("assemble").is_view
    assert IN_PLACE_TARGETS["store"] == "output_tensor" and "load" not in IN_PLACE_TARGETS


def test_elementwise_ops_broadcast_and_keep_every_dim_independent():
    for name in ("add", "tile.add", "tensor.mul", "maxs", "row_expand_mul", "exp"):
        d = opdef(name)
        assert (d.shape, d.coalesce, d.broadcasts) == (Shape.SAME, ANY_DIM, True), name
    assert not opdef("cast").broadcasts and not opdef("part_add").broadcasts
    assert opdef("cmp").non_operands == {"cmp_type"}


def test_reductions_keep_the_other_dim_independent():
    assert (opdef("row_sum").shape, opdef("row_sum").coalesce) == (Shape.ROW_REDUCE, ROWS)
    assert (opdef("tile.col_max").shape, opdef("tile.col_max").coalesce) == (Shape.COL_REDUCE, COLS)
    assert opdef("row_argmax").coalesce == NO_DIM
    assert opdef("row_expand").coalesce == ROWS and opdef("reshape").coalesce == ROWS


def test_the_host_waits_for_data_ops_not_for_views_or_creation():
    for name in ("read", "tensor.read", "add", "assemble", "matmul", "pld.allreduce"):
        assert opdef(name).waits_on_host, name
    for name in ("slice", "tensor.reshape", "tensor.create", "tile.ci", "full", "dim", "system.fence", "__getitem__"):
        assert not opdef(name).waits_on_host, name
    assert names_where(lambda d: d.reads_data) == {"read", "tensor.read", "tile.read"}


def test_shape_from_an_argument_needs_that_argument():
    with pytest.raises(ValueError, match="shape_arg"):
        OpDef(("made_up",), shape=Shape.FROM_ARG)
    with pytest.raises(ValueError, match="shape_arg"):
        OpDef(("made_up",), shape_arg=(0, "shape"))
