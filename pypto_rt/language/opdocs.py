"""What every `pl` / `pld` op does: the text `help(pl.add)` shows.

A data module that imports nothing from pypto_rt, so both sides read it without an upward import: the `pl` stubs
(language/ops.py) take their `__doc__` from it, and the op library's registration (ops/registry.py) puts the same
text in each op's `OpDef.doc` and on its implementation (as torch's `_torch_docs.py` documents its builtins). The
semantics are those of the spec (`pl_api.md`) as this runtime implements them. Keys are qualified op names; a
`tensor.X` / `tile.X` name without an entry of its own has the doc of `X`. Filled at import, never mutated after.
"""
from __future__ import annotations

import re
from textwrap import dedent

DOCS: dict[str, str] = {}


def doc_of(qualname: str) -> str:
    """The doc of the op `qualname` ("" when none is written)."""
    if qualname in DOCS:
        return DOCS[qualname]
    namespace, _, base = qualname.partition(".")
    return DOCS.get(base, "") if namespace in ("tensor", "tile") else ""


def _wrap(paragraph: str, width: int = 100) -> str:
    """The paragraph filled to `width` columns, never breaking inside a bracketed shape such as [1, N]. (Greedy,
    like textwrap.fill for plain words, at a tenth of its cost: every doc is filled when `pl` is imported.)"""
    glued = re.sub(r"\[[^\]]*\]", lambda m: m.group().replace(" ", "\0"), " ".join(paragraph.split()))
    lines, line = [], ""
    for word in glued.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return "\n".join(lines).replace("\0", " ")


def _spelled(name: str) -> str:
    return name if name.startswith("pld.") else f"pl.{name}"


def _doc(names: str, signature: str, text: str) -> None:
    """Document the ops `names` (space-separated qualified names; the first is how the doc spells the op)."""
    first, *aliases = names.split()
    header = _spelled(first) + signature + "".join(f"\n(also {_spelled(a)})" for a in aliases)
    paragraphs = dedent(text).strip().split("\n\n")
    doc = "\n\n".join([header] + [_wrap(p) for p in paragraphs])
    for name in names.split():
        assert name not in DOCS, f"{name} documented twice"
        DOCS[name] = doc


_PROMOTED = "The result dtype is the promotion of both operands' dtypes (float beats int, then the wider type)."
_BOXES = ("Tensor operands broadcast numpy-style ([16, 64] with [1, 64]); the result keeps the lhs's valid box when "
          "the rhs is a number, or when both have the same shape and valid box, and is fully valid otherwise.")

# ------------------------------------------------------------------------------------ elementwise arithmetic

for _name, _formula, _scalar in (("add", "lhs + rhs", "adds"), ("sub", "lhs - rhs", "subs"),
                                 ("mul", "lhs * rhs", "muls"), ("div", "lhs / rhs", "divs")):
    _doc(_name, "(lhs, rhs" + (", high_precision=False)" if _name == "div" else ")"), f"""
        Elementwise {_formula}.

        lhs: a tensor or tile. rhs: a tensor or tile of a broadcastable shape, or a number (the `{_scalar}` form).
        Two numbers give the number. {_PROMOTED} {_BOXES}""" + {
        "sub": "\nWith a number rhs the result keeps the lhs dtype.",
        "div": "\nFloats divide exactly; integers divide truncating toward zero (x / 0 gives 0). `high_precision` is "
               "a precision hint only.",
    }.get(_name, ""))
    _doc(_scalar, "(lhs, rhs)", f"""
        Elementwise {_formula} with a number rhs (pl.{_name} for two tensors).

        lhs: a tensor or tile. rhs: a Python number or scalar. """ + (
        "The result keeps the lhs dtype." if _scalar == "subs" else _PROMOTED) + " The result keeps lhs's valid box.")

for _name, _what in (("maximum", "max"), ("minimum", "min")):
    _doc(_name, "(lhs, rhs)", f"""
        Elementwise {_what}(lhs, rhs); the rhs may be a number (pl.maximum(x, 0.0) is relu).

        {_PROMOTED} {_BOXES}""")
    _doc(f"{_name}s {_what}s", "(lhs, rhs)", f"""
        Elementwise {_what}(lhs, scalar) with a number rhs (pl.{_name} for two tensors).

        {_PROMOTED} The result keeps lhs's valid box.""")
_doc("fmod", "(lhs, rhs)", f"""
    Elementwise remainder with the sign of the dividend (C fmod, torch.fmod); the rhs may be a number.

    Integer x fmod 0 gives 0. {_PROMOTED} {_BOXES}""")
_doc("fmods", "(lhs, rhs)", "Elementwise fmod(lhs, scalar) with a number rhs: the remainder with the sign of lhs.")
_doc("rem", "(lhs, rhs, tmp=None)", f"""
    Elementwise Python `%` (tile level): the remainder with the sign of the divisor; integer x % 0 gives 0.

    tmp: a scratch tile (accepted and ignored). {_PROMOTED}""")
_doc("rems", "(lhs, rhs, tmp=None)", "Elementwise lhs % scalar (the sign of the divisor); `tmp` is ignored.")
for _name, _formula in (("addc", "lhs + rhs + carry"), ("subc", "lhs - rhs + carry")):
    _doc(_name, "(lhs, rhs, carry)", f"""
        Elementwise {_formula} on tiles, rounded after each of the two steps as on the device.""")
for _name, _formula in (("addsc", "lhs + scalar + carry"), ("subsc", "lhs - scalar + carry")):
    _doc(_name, "(lhs, scalar, carry)", f"""
        Elementwise {_formula} on tiles with a number `scalar`, rounded after each step as on the device.""")
for _name, _what in (("part_add", "lhs + rhs"), ("part_mul", "lhs * rhs"), ("part_max", "max(lhs, rhs)"),
                     ("part_min", "min(lhs, rhs)")):
    _doc(_name, "(lhs, rhs)", f"""
        {_what} where both operands are valid, the valid operand where only one is (same physical shapes).

        The result's valid box spans both operands' boxes (their union's extent per axis).""")
_doc("min", "(a, b)", "The smaller of two scalars (not a reduction: for tensors use pl.minimum or pl.row_min).")
_doc("max", "(a, b)", "The larger of two scalars (not a reduction: for tensors use pl.maximum or pl.row_max).")

# ----------------------------------------------------------------------------------------- unary math

for _name, _what, _note in (
        ("neg", "-x", ""), ("abs", "|x|", ""),
        ("exp", "e ** x", "Float inputs; subnormal results flush to 0 as on the device."),
        ("log", "the natural log of x", "Float inputs; `high_precision` (tensor only) is a hint."),
        ("sqrt", "the square root of x", "Float inputs."),
        ("rsqrt", "1 / sqrt(x)", "Float inputs; `high_precision=True` is tensor-only (the tile form takes a "
                                 "scratch tile as its second argument instead)."),
        ("recip", "1 / x", "Float inputs; `high_precision` (tensor only) is a hint."),
        ("relu", "max(x, 0)", "Tile level."), ("sin", "sin(x)", "FP32 only."), ("cos", "cos(x)", "FP32 only.")):
    _hint = ", high_precision=False" if _name in ("log", "rsqrt", "recip") else ""
    _doc(_name, f"(input{_hint})", f"""
        Elementwise {_what}. {_note}

        The result keeps the input's shape, dtype and valid box.""")
_doc("lrelu", "(input, slope)", "Elementwise where(x > 0, x, x * slope) with a number slope; keeps the input dtype.")
_doc("prelu", "(input, slope, tmp=None)", """
    Elementwise where(x > 0, x, x * slope) with a tensor slope (broadcast) or a number; keeps the input dtype
    and valid box. tmp: a scratch tile (ignored).""")

# ----------------------------------------------------------------------------------- compare / select / bits

_doc("cmp", "(lhs, rhs, cmp_type=0)", """
    Elementwise comparison. cmp_type: 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge (or those names as strings).

    rhs: a tensor/tile (broadcast) or a number. The tensor form returns 0/1 in the promoted operand dtype (cast it
    or add it); the tile form returns a mask for pl.sel / pl.sels. The result is fully valid.""")
_doc("cmps", "(lhs, rhs, cmp_type=0)", "pl.cmp with a number rhs (tile level): a mask for pl.sel / pl.sels.")
_doc("sel", "(mask, lhs, rhs, tmp=None)", """
    Elementwise where(mask, lhs, rhs) (tile level); mask from pl.cmp / pl.cmps, rhs a tile or a number.

    The result keeps lhs's valid box; tmp is a scratch tile (ignored).""")
_doc("sels", "(mask, src, tmp=None, scalar=None)", """
    Elementwise where(mask, src, scalar) (tile level); keeps src's dtype and valid box; tmp is ignored.""")
_SHIFT_NOTE = "; shift counts must be in [0, bits)"
for _name, _what in (("and_", "and"), ("or_", "or"), ("xor", "xor"), ("shl", "shift left"),
                     ("shr", "shift right")):
    _tmp = ", tmp=None" if _name == "xor" else ""
    _doc(_name, f"(lhs, rhs{_tmp})", f"""
        Elementwise bitwise {_what} of integers; rhs is a tensor of the same shape and dtype (no broadcasting) or
        an integer. The result keeps the lhs dtype{_SHIFT_NOTE if "shift" in _what else ""}.""")
    _scalar = _name.rstrip("_") + "s"
    _doc(_scalar, f"(lhs, rhs{_tmp})", f"""
        Elementwise bitwise {_what} of an integer tensor with an integer scalar rhs (pl.{_name} for two tensors);
        keeps the lhs dtype.""")
_doc("not_", "(input)", "Elementwise bitwise NOT; INT16 / UINT16 only (pl.xors(x, -1) inverts other integer types).")

# ------------------------------------------------------------------------------ reductions and broadcasts

for _side, _axis, _out in (("row", "each row (the last axis)", "[M, 1]"), ("col", "each column (axis -2)", "[1, N]")):
    for _kind in ("sum", "max", "min", "prod", "argmax", "argmin"):
        _what = f"index (INT32, first occurrence) of the {_kind[3:]}" if _kind.startswith("arg") else _kind
        _doc(f"{_side}_{_kind}", "(input, tmp_tile=None)", f"""
            The {_what} over the valid part of {_axis}; the result is {_out} (keepdim).

            Cells outside the valid box never count. Value reductions keep the input dtype (16-bit floats
            accumulate in FP32); the reduced axis becomes a fully valid unit axis. tmp_tile: the tile form's
            scratch tile (accepted and ignored).""")
    _vec = "[M, 1] per-row" if _side == "row" else "[1, N] per-column"
    for _op, _formula in (("add", "x + v"), ("sub", "x - v"), ("mul", "x * v"), ("div", "x / v"),
                          ("max", "max(x, v)"), ("min", "min(x, v)"), ("expdif", "exp(x - v)")):
        _tmp = ", tmp=None" if (_side, _op) == ("row", "add") else ""
        _doc(f"{_side}_expand_{_op}", f"(lhs, rhs{_tmp})", f"""
            {_formula} with a {_vec} vector v = rhs broadcast over x = lhs.

            The result has the promoted dtype and x's valid box.""")
    _doc(f"{_side}_expand", f"(target, {_side}_vec)", f"""
        The {_vec} vector broadcast to target's shape (target's values are not used); promoted dtype.""")

# ------------------------------------------------------------------------------------ creation / movement

_doc("create_tensor tensor.create", "(shape, dtype, layout=ND, manual_dep=False, init_value=None)", """
    A new tensor of `shape` and `dtype`. Its contents are undefined on the device unless `init_value` is given;
    here it holds zeros (or init_value).""")
_doc("full", "(shape, dtype, value)", "A new tensor of `shape` with every element `value` (a runtime scalar too).")
_doc("tile.full", "(shape, dtype, value)", "A new tile of `shape` with every element `value`.")
_doc("create_tile tile.create", "(shape, dtype, target_memory=Mem.Vec, transpose=None, *, flat_layout=None)", """
    A scratch tile of `shape` and `dtype`; undefined on the device (zeros here).""")
_doc("create_l1", "(shape, dtype, transpose=False)", "An on-chip matmul operand buffer (zeros here) for pl.gather_row.")
_doc("arange tensor.ci", "(start, shape, dtype=INT32, descending=False)", """
    A [1, N] tensor with out[0, k] = start + k (start - k when descending); leading dims must be 1.""")
_doc("tile.arange tile.ci", "(start, shape, dtype=INT32, descending=False)", "The tile form of pl.arange.")
_doc("tri", "(diagonal, shape, valid_shape=None, dtype=INT32, upper=False)", """
    A tile with 1 where j <= i + diagonal (lower) or j >= i + diagonal (upper), else 0.""")
_doc("random", "(k0, k1, c0, c1, c2, c3, shape, dtype=UINT32, rounds=10)", """
    Counter-based random numbers. Not supported by this runtime (no bit-exact CPU model).""")
_doc("expands", "(target, scalar)", "A value shaped and typed like `target` (its valid box too), all `scalar`.")
_doc("expand_clone", "(src, target)", "A copy of `src` broadcast to `target`'s shape.")
_doc("load", "(tensor, offsets, shapes, valid_shape=None, target_memory=Mem.Vec, clamp=False)", """
    A tile holding the window of `tensor` at `offsets` of size `shapes` (offsets before shapes).

    Cells outside `valid_shape` or outside the tensor are zero; the result's valid box is valid_shape clipped to
    the source.""")
_doc("store", "(tile, offsets, output_tensor, shapes=None, *, atomic=AtomicType.None_)", """
    Write the tile's valid box into `output_tensor` at `offsets`, in place, and return the tensor.
    atomic=pl.AtomicType.Add adds into it instead.""")
_doc("move", "(tile, target_memory=None, blayout=None, slayout=None)", """
    Move a tile between on-chip memories (Mat, Left, Right, Acc, Vec): an identity on the CPU.""")
_doc("gather_row", "(acc, src, dst_offset, src_offset, shapes, transpose=False, *, valid_shape=None)", """
    acc[dst window] = src[src window], in place; returns acc. transpose=True places an [r, c] window as [c, r].""")
_doc("cast", "(input, target_type, mode='round')", """
    `input` converted to `target_type`; shape and valid box are kept.

    mode: 'none', 'rint' (nearest, ties to even), 'round' (nearest, ties away from zero; the default), 'floor',
    'ceil', 'trunc', 'odd' (or 0..6). Float to int rounds by the mode, then saturates. A Python number (default
    mode only) gives a number.""")
_doc("const", "(value, dtype)", "The Python number `value` as a scalar of `dtype` (converted like a scalar pl.cast).")

# ------------------------------------------------------------------------------------------ views / shape

_doc("slice", "(x, shape, offset, valid_shape=None, drop_dims=None, pad_value=None, clamp=False)", """
    A view of the window of `x` of size `shape` at `offset` (shape before offset).

    valid_shape narrows the valid box (never widens it); pad_value is what fills outside the valid box when
    materialised. A window running past x is a zero-padded copy whose valid box is clipped to x.""")
_doc("assemble", "(target, source, offset, *, atomic=AtomicType.None_)", """
    Write source's valid box into `target` at `offset`, in place, and return target.

    atomic=pl.AtomicType.Add adds into the window (target pre-zeroed by the kernel). A source of higher rank has
    its leading unit axes squeezed.""")
_doc("reshape", "(x, shape)", """
    An aliasing view of `x` with a new shape of the same element count (entries may be runtime scalars); writes
    through it reach x. The valid box is remapped when its cells form a box in the new shape.""")
_doc("transpose", "(x, axis1, axis2, tmp_tile=None)", "Swap two axes (negative axes allowed); returns a new value.")
_doc("tile.transpose_view", "(x)", "A zero-copy view with the last two axes swapped.")
_doc("concat", "(a, b)", "a and b concatenated along the last axis.")
_doc("reinterpret_view", "(x, dtype, *, shape=None)", """
    A view of x's bits as `dtype`; the last axis scales by the byte-width ratio.""")
_doc("set_validshape", "(x, valid_rows, valid_cols)", """
    A 2-D value sharing x's data with the valid box [valid_rows, valid_cols] (runtime scalars allowed).""")
_doc("fillpad", "(x, pad_value=PadValue.zero)", """
    A copy of x with every cell outside the valid box set to the pad; the result is fully valid.

    pad_value: PadValue.zero, PadValue.min / max (the dtype's most negative / largest finite value), or the sugars
    0, -math.inf, math.inf.""")
_doc("fillpad_inplace", "(x, pad_value=PadValue.zero)", "pl.fillpad written into x itself; x becomes fully valid.")
_doc("fillpad_expand", "(x, shape, pad_value=PadValue.zero)", """
    A `shape` buffer holding x's valid box at the top left and the pad everywhere else.""")
_doc("dim", "(t, axis)", "The runtime extent of axis `axis` of t (negative axes allowed), as a scalar.")
_doc("read", "(src, indices)", """
    The element of `src` at `indices` (one per axis, or an int for 1-D) as a scalar of its dtype. The host reads
    it after the tasks that write src have finished.""")
_doc("__getitem__", "(x, key)", """
    x[a:b, c]: a view of the window (scalar indices drop their axis, no steps); an all-scalar full-rank index reads
    one element (pl.read).""")
_doc("__setitem__", "(dst, key, src)", "dst[a:b, c:d] = src: pl.assemble of src's valid box into that window.")
_doc("write", "(dst, indices, value)", "Store `value` (converted to dst's dtype) into dst at `indices`, in place.")

# ---------------------------------------------------------------------------------------------- matmul

_doc("matmul", "(lhs, rhs, out_dtype=None, a_trans=False, b_trans=False, c_matrix_nz=False)", """
    [M, K] @ [K, N] -> [M, N]. a_trans: lhs is stored [K, M]; b_trans: rhs is stored [N, K]. 1-D operands and
    batched ones (batch dims broadcast) work too; operands are zero outside their valid boxes.

    Float operands multiply in FP32, integer ones in INT32; the result has out_dtype (FP32 / INT32 by default).""")
_doc("matmul_acc", "(acc, lhs, rhs, a_trans=False, b_trans=False, init_cond=None)", """
    acc + lhs @ rhs as a new value in acc's dtype (FP32, or INT32 for integer operands); a truthy init_cond gives
    lhs @ rhs instead. Rebind it: acc = pl.matmul_acc(acc, a, b).""")
_doc("tile.matmul", "(lhs, rhs)", "2-D tile matmul; FP32 result for float tiles, INT32 for integer tiles.")
_doc("tile.matmul_acc", "(acc, lhs, rhs, init_cond=None)", "acc + lhs @ rhs on 2-D tiles (acc FP32 / INT32).")
_doc("matmul_bias", "(lhs, rhs, bias)", "lhs @ rhs + bias[1, N] in the accumulator dtype (FP32 / INT32).")
_doc("batch_matmul", "(lhs, rhs)", "Batched [..., M, K] @ [..., K, N] with broadcast batch dims; FP32 / INT32 result.")
_doc("tile.batch_matmul_acc", "(acc, lhs, rhs)", "acc + the batched lhs @ rhs.")
_doc("gemv", "(lhs, rhs, acc_phase=None)", "[1, K] @ [K, N] -> [1, N]; INT32 for INT8 operands, else FP32.")
_doc("gemv_acc", "(acc, lhs, rhs, acc_phase=None)", "acc[1, N] + lhs[1, K] @ rhs[K, N].")
_doc("gemv_bias", "(lhs, rhs, bias, acc_phase=None)", "lhs[1, K] @ rhs[K, N] + bias[1, N].")
for _name, _extra in (("matmul_mx", ""), ("matmul_mx_acc", "acc, "), ("matmul_mx_bias", "")):
    _doc(_name, f"({_extra}lhs, lhs_scale, rhs, rhs_scale{', bias' if 'bias' in _name else ''})", """
        MX FP8 block-scaled matmul (A5). Not supported by this runtime.""")

# ------------------------------------------------------------------------------------ gather / scatter / sort

_doc("gather", "(input, dim=None, index=None, *, mask_pattern=None, output_dtype=None, kvalue=None, ...)", """
    Three forms. Index: gather(x[B, W], dim=-1, index=idx[B, K]) -> out[b, k] = x[b, idx[b, k]]. Mask:
    gather(x, mask_pattern=pl.tile.MaskPattern.P0101) -> the pattern's columns of every row; output_dtype
    reinterprets the bits (FP32 -> INT32 extracts sort32 index lanes). Compare: gather(x, kvalue=, cmp_mode=,
    out_cols=, offset=0, count_dtype=None) -> (indices, counts).""")
_doc("tile.gather", "(src, indices=None, tmp=None, *, mask_pattern=None, output_dtype=None)", """
    dst[i, j] = src.flat[indices[i, j]] (flat indices into src); with mask_pattern= the mask form of pl.gather.""")
_doc("tile.gather_mask", "(src, mask_pattern, *, output_dtype=None)", "The mask form of pl.gather at tile level.")
_doc("tile.gather_compare", "(src, kvalue, tmp=None, *, cmp_mode='eq', offset=0, out_cols=None, count_dtype=None)", """
    The compare form of pl.gather at tile level: (indices [rows, out_cols] INT32, counts [1, rows]).""")
_doc("scatter", "(input, dim=None, index=None, src=None, *, mask_pattern=None, dst=None)", """
    Index form: scatter(x, dim=-1, index=idx, src=s) -> a copy of x with out[b, idx[b, k]] = s[b, k]. Mask form:
    scatter(src, mask_pattern=P, dst=buf) writes src into P's columns of buf in place and returns buf.""")
_doc("tile.scatter", "(dst, src, indexes)", "dst.flat[indexes[i, j]] = src[i, j] in place; returns dst.")
_doc("tile.scatter_mask", "(dst, src, mask_pattern)", "Write src into the pattern's columns of dst in place.")
_doc("mscatter", "(src, idx, output_tensor, coalesce='elem', *, scatter_oob='undefined', scatter_conflict='last', "
     "some_kept=False)", """
    Scatter-store in place, returns output_tensor: coalesce='elem' -> output_tensor.flat[idx[i, j]] = src[i, j]
    over src's valid box; 'row' -> output_tensor[idx.flat[r], :] = src[r, :] (idx [1, R] or [R, 1]). The ISA's
    MSCATTER policies: scatter_oob for an index read as uint32 past the target ('undefined': an error here,
    'skip': no write, so -1 writes nothing, 'clamp', 'wrap'); scatter_conflict for a repeated target ('last':
    the last write in index order, 'default': unspecified which, and no pass to order them). some_kept=True (this
    runtime's hint, 'row' with 'skip' only): the caller guarantees a kept row in every call, so skipped rows
    rewrite a kept row with its own data instead of a spare row; a call keeping none raises.""")
_doc("scatter_update", "(input, dim, index, src)", """
    Row scatter in place: row index.flat[n] of input ([rows, d], or a paged [blocks, block_size, 1, d] cache)
    becomes src's row n.""")
_doc("gatherb", "(src, offset, *, output_dtype=None)", """
    One 32-byte block of src per UINT32 byte offset: out row r, block b <- src bytes [off, off + 32).""")
_doc("mgather", "(mem, idx, coalesce='row', *, gather_oob='undefined', target_memory=None, scratch=None, "
                "valid_shape=None)", """
    Gather-load: coalesce='row' -> out[i, :] = mem[idx.flat[i], :]; 'elem' -> out = mem.flat[idx]. Entries
    outside idx's valid box give zero rows / elements.""")
_doc("paged_gather", "(src, indices, block_table, block_size, size, max_indices, *, space=None, col_off=0, "
                     "is_trans=False, is_b_matrix=False)", """
    Rows phys = block_table[idx // block_size] * block_size + idx % block_size of a 2-D pool; the result is
    [max_indices, size] (transposed with is_trans), zero beyond the given indices.""")
_doc("sort32", "(src, idx)", """
    src [rows, N] values (FP32 / FP16) with idx [rows, N] UINT32 indices -> [rows, 2N] (value, index) pairs, each
    32-element block sorted descending (stable); index lanes hold the index bits in the value dtype's slots.""")
_doc("mrgsort", "(src0, src1=None, src2=None, src3=None, tmp=None, exhausted=False, *, block_len=None)", """
    Format 1, mrgsort(s, block_len=B): merge every 4 adjacent sorted runs of B positions into one. Format 2,
    mrgsort(a, b[, c[, d]]): merge 2..4 sorted pair rows (the tile form also takes tmp=; exhausted is ignored).""")

# ------------------------------------------------------------------------------ tasks, scheduling, hints

_doc("system.task_dummy", "(*, deps=None)", "A task that does nothing but wait for `deps`; returns its TaskId.")
_doc("array.create", "(n, dtype)", """
    A length-n array (pl.TASK_ID or an integer dtype): TaskId slots start empty, integer slots at 0; index it
    with arr[i] and arr[i] = v.""")
_doc("no_dep", "(t)", "Mark t as carrying no dependency (a scheduling hint); returns t.")
_doc("dump_tag", "(t, *args, **kwargs)", "Tag t for a debug dump (a hint; no effect here).")
_doc("prefetch.make_context", "(*args, **kwargs)", "A prefetch context (a hint; no effect here).")
_doc("prefetch.async_prefetch", "(t, ctx=None, *args, **kwargs)", "Prefetch t into L2 (a hint; no effect here).")
_doc("system.cacheinvalid", "(*args, **kwargs)", "Invalidate caches (nothing to do on the CPU).")
_doc("system.fence", "(*args, **kwargs)", "A memory fence (program order already holds on the CPU).")
_doc("system.syncall", "(*args, **kwargs)", "A barrier across the blocks of one pl.spmd dispatch.")
_doc("aiv_shard", "(x)", "A cube -> vector crossing: in a pl.split_aiv UP_DOWN / LEFT_RIGHT region the lane's "
     "part of the rows / columns, else x.")
_doc("aic_gather", "(x)", "A vector -> cube crossing: x (refused in a pl.split_aiv UP_DOWN / LEFT_RIGHT region, "
     "whose lanes run one after another here).")
_doc("static_print", "(*args)", "Print at compile time (here: when the line runs).")
_doc("static_assert", "(cond, msg='static_assert failed')", "Fail with `msg` when `cond` is false.")
_doc("func_attr", "(attrs=None)", "Function attributes, as the first statement of a body (no effect here).")
_doc("get_block_idx", "()", "The index of the current block of a pl.spmd dispatch (0 outside one).")
_doc("get_block_num", "()", "The number of blocks of the current pl.spmd dispatch (1 outside one).")
_doc("get_subblock_idx", "()", "The AIV lane inside pl.split_aiv (0 outside one).")
_doc("submit", "(kernel, *args, deps=None)", "Run `kernel(*args)` as a task after `deps`; returns (result, TaskId).")
_doc("spmd_submit", "(kernel, *args, core_num, deps=None)", """
    Run `kernel(*args)` as core_num blocks after `deps`; returns (result, TaskId).""")

# ----------------------------------------------------------------------- distributed (pld), see README

_doc("pld.system.notify", "(target, peer, offsets, value=1, op=NotifyOp.AtomicAdd)", """
    Atomically add `value` to (op=NotifyOp.Set: set) the INT32 cell target[offsets] of the window on rank
    `peer`.""")
_doc("pld.system.wait", "(signal, offsets, expected, cmp=WaitCmp.Ge)", """
    Block until this rank's INT32 cell signal[offsets] is >= (WaitCmp.Ge) or == (WaitCmp.Eq) `expected`.""")
_doc("pld.tile.remote_load", "(target, peer, offsets, shape, valid_shape=None)", """
    A tile holding a copy of rank `peer`'s window target[offsets : offsets + shape].""")
_doc("pld.tile.remote_store pld.tensor.remote_store", "(src, target, peer, offsets, atomic=None)", """
    Write src (atomic=pl.AtomicType.Add: add it) into rank `peer`'s window target[offsets : offsets + src.shape].""")
_doc("pld.tensor.put", "(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None, atomic=None)", """
    Copy the local src[src_offsets : + shape] into rank `peer`'s window dst at dst_offsets.""")
_doc("pld.tensor.get", "(dst, peer, src, dst_offsets=None, src_offsets=None, shape=None)", """
    Copy rank `peer`'s window src[src_offsets : + shape] into the local dst at dst_offsets; returns dst.""")
_doc("pld.allreduce", "(data, signal=None, op=ReduceOp.Sum)", """
    In place: every rank's `data` becomes the elementwise reduction (op) of all ranks' data. Inside a kernel or
    in the plain Python of a launched rank.""")
_doc("pld.allgather", "(out, inp, signal=None)", "out[r] = rank r's inp on every rank (out has a leading rank axis).")
_doc("pld.reduce_scatter", "(out, inp, signal=None, op=ReduceOp.Sum)", """
    out = the reduction over ranks of this rank's chunk of inp (chunks along axis 0).""")
_doc("pld.all_to_all", "(out, inp, signal=None)", """
    Chunk r (axis 0) of inp goes to rank r; out's chunk s comes from rank s.""")
_doc("pld.all_to_all_v", "(out, inp, send_counts, recv_counts, signal=None)", """
    Like pld.all_to_all with send_counts[r] rows (axis 0) to rank r; only the live rows travel.""")
_doc("pld.broadcast", "(data, signal=None, root=0)", "In place: every rank's `data` becomes rank `root`'s.")
_doc("pld.barrier", "(signal=None)", "Every rank waits until all have arrived.")
