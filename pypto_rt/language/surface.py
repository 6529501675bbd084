"""The op names of the `pl` surface, per namespace (`pl.X`, `pl.tensor.X`, `pl.tile.X`, ...).

Each name becomes an `OpStub` that forwards the call to the active executor under its
qualified name ("add", "tensor.add", "tile.add", "system.task_dummy"). The op library
registers an implementation (or a "not supported yet" one) for every name listed here;
`tests/language/test_surface.py` keeps the two in step.
"""
from __future__ import annotations

_ELEMENTWISE = """
add sub mul div adds subs muls divs maximum minimum neg abs exp log sqrt rsqrt recip sin cos fmod fmods
part_add part_mul part_max part_min cmp and_ or_ xor not_ shl shr ands ors xors shls shrs cast expands
expand_clone
"""
# Tile-level elementwise ops (also re-exported at pl.*), absent from pl.tensor.
_TILE_ELEMENTWISE = """
maximums minimums rem rems relu lrelu prelu addc subc addsc subsc cmps sel sels
"""
_REDUCE = """
row_sum row_max row_min row_prod col_sum col_max col_min col_prod row_argmax row_argmin col_argmax col_argmin
row_expand_add row_expand_sub row_expand_mul row_expand_div row_expand_max row_expand_min row_expand_expdif
col_expand_expdif col_expand_add col_expand_sub col_expand_mul col_expand_div col_expand_max col_expand_min
row_expand col_expand
"""
_VIEWS = """
slice assemble reshape transpose concat reinterpret_view set_validshape fillpad fillpad_inplace fillpad_expand
dim read write gather scatter sort32 mrgsort arange gather_row
"""
_SHARED = _ELEMENTWISE + _REDUCE + _VIEWS

TOP = set((_SHARED + _TILE_ELEMENTWISE + """
maxs mins const min max create_tensor full create_tile tri random load store move create_l1 matmul matmul_acc
matmul_bias batch_matmul gemv gemv_acc gemv_bias matmul_mx matmul_mx_acc matmul_mx_bias scatter_update
mscatter gatherb mgather paged_gather no_dep dump_tag aiv_shard aic_gather static_print static_assert func_attr
submit spmd_submit get_block_idx get_block_num get_subblock_idx
""").split())

TENSOR = set((_SHARED + """
create create_tensor full ci matmul matmul_acc get_block_idx get_block_num fillpad_inplace paged_gather
scatter_update
""").split())

TILE = set((_SHARED + _TILE_ELEMENTWISE + """
full create create_tile create_l1 ci load store move tri random transpose_view matmul matmul_acc matmul_bias
batch_matmul batch_matmul_acc gemv gemv_acc gemv_bias matmul_mx matmul_mx_acc matmul_mx_bias mscatter gatherb
mgather aiv_shard aic_gather get_block_idx get_block_num get_subblock_idx gather_compare gather_mask paged_gather
scatter_mask scatter_update
""").split())

SYSTEM = {"task_dummy", "syncall", "cacheinvalid", "fence"}
ARRAY = {"create"}
PREFETCH = {"make_context", "async_prefetch"}

NAMESPACES = {"tensor": TENSOR, "tile": TILE, "system": SYSTEM, "array": ARRAY, "prefetch": PREFETCH}

# Names whose meaning is the executor's own state (block index, sub-kernel submission, barriers).
EXECUTOR_INTRINSICS = {
    "get_block_idx", "get_block_num", "get_subblock_idx", "tile.get_block_idx", "tile.get_block_num",
    "tile.get_subblock_idx", "tensor.get_block_idx", "tensor.get_block_num", "submit", "spmd_submit",
    "system.syncall", "aiv_shard", "tile.aiv_shard", "aic_gather", "tile.aic_gather",
}


def qualified_names() -> set[str]:
    """Every qualified op name of the surface."""
    names = set(TOP)
    for ns, members in NAMESPACES.items():
        names |= {f"{ns}.{m}" for m in members}
    return names
