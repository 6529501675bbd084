"""Paged decode and chunked-prefill attention as `@pl.jit` kernels built per shape.

Caches are [num_blocks, block_size, KVH, D] (num_blocks dynamic: a layer's pool or a slice of a stacked one),
viewed as [slots * KVH, D] rows; block_tables [B, max_blocks] INT32, seq_lens [B] INT32 (context length after
this step's tokens). Lengths, offsets and table entries are read inside the regions: the host programs read no
data. Per tile of KV_TILE context positions the kernels build the cache row of every KV head through the block
table, gather them in one op per cache, and run one batched matmul for all heads' scores (GQA: query head h
reads KV head h // (QH // KVH)), an FP32 online-softmax step and one batched matmul for the values.

- Decode: one region for the whole batch; the tile loop runs to the longest length. Its KV tile is picked per
  call from the host's bound on the lengths (decode_tile: powers of two from the block size up to KV_TILE, one
  kernel each), so a 97-token context gathers 128 positions, not 256. A position's block comes from a gather at
  an index computed from constants; positions past a request's length read its first rows and are masked.
- Prefill: one spmd block per request, Q_TILE queries by KV_TILE positions a tile, causal. A query tile's rows
  are gathered and scattered by row id; rows past the chunk repeat its last query (the same visible context),
  so they rewrite that query's output and no other request's rows, with no valid box taken from data. out is
  zeroed first, so rows of no request (a padded batch's tokens past qsl[B]) hold zeros, never stale data.

Positions past a length, or after a query's own position, are masked to NEG_CAP; their rows are gathered from
the request's written positions (prefill: its last, clamped; decode: its first), so no unwritten slot is read for
a request with context. A request of length 0 (a padded row) gets zeros and no NaN (pitfall 3): its table
entries are ignored (block 0 stands in, whatever the row holds: 0, -1 or stale ids) and its result is replaced
by zeros. A length past the block table's span (max_blocks * block_size) is an error of the cache gather.

Loop trip counts come from the lengths, so a call replays while every length stays within its tile count (for
prefill, every query count within its Q_TILE too); data inside a tile never pins the course. A decode's longest
length has its tile as a floor: while every length stays within the tile, the replay's guards say only that, so
it holds whichever request is the longest (past the tile they also pin which one is).
"""
import functools
from dataclasses import dataclass

import pypto.language as pl

KV_TILE = 256
Q_TILE = 64
NEG_CAP = -1.0e30
NB_DYN = pl.dynamic("NB_DYN")
T_DYN = pl.dynamic("T_DYN")
B_DYN = pl.dynamic("B_DYN")
QSL_DYN = pl.dynamic("QSL_DYN")


@dataclass(frozen=True)
class AttnShape:
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    max_blocks: int
    dtype: object               # the pl dtype of query, caches and out
    scale: float

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


def _cache_rows(shape: AttnShape):
    """An inline `(table_row [1, max_blocks], pos [1, KV_TILE], length) -> [1, KVH * KV_TILE]` row ids of a
    [slots * KVH, D] cache view, head-major: entry g * KV_TILE + i is KV head g of position min(pos[i], length-1)."""
    kvh, bs = shape.kv_heads, shape.block_size

    @pl.jit.inline
    def cache_rows(table_row, pos, length):
        inside = pl.maxs(pl.mins(pos, length - 1), 0)
        blocks = pl.gather(table_row, dim=-1, index=pl.divs(inside, bs))
        slots = pl.add(pl.muls(blocks, bs), pl.rems(inside, bs))
        heads = pl.reshape(pl.arange(0, [1, kvh], dtype=pl.INT32), [kvh, 1])
        return pl.reshape(pl.add(pl.muls(slots, kvh), heads), [1, kvh * KV_TILE])

    return cache_rows


def _attend(shape: AttnShape, q_tile: int):
    """An inline `(q_rows [q_tile, QH * D], q_pos0, length, table_row, k_rows, v_rows) -> [q_tile, QH * D]` in
    the query's dtype: query row r at position q_pos0 + r attends to positions 0..min(q_pos0 + r, length - 1).
    k_rows / v_rows are the caches viewed as [slots * KVH, D]."""
    qh, kvh, d, group, dt = shape.q_heads, shape.kv_heads, shape.head_dim, shape.group, shape.dtype
    rows = q_tile * qh
    cache_rows, in_dtype = _cache_rows(shape), _in_dtype(dt)

    @pl.jit.inline
    def attend(q_rows, q_pos0, length, table_row, k_rows, v_rows):
        q_heads = pl.transpose(pl.reshape(q_rows, [q_tile, kvh, group, d]), 0, 1)
        q_t = pl.transpose(pl.reshape(q_heads, [kvh, q_tile * group, d]), 1, 2)
        q_pos = pl.reshape(pl.adds(pl.arange(0, [1, q_tile], dtype=pl.INT32), q_pos0), [q_tile, 1])
        visible = pl.mins(pl.adds(q_pos, 1), length)
        kv_end = pl.min(q_pos0 + q_tile, length)
        m0 = pl.full([rows, 1], dtype=pl.FP32, value=NEG_CAP)
        l0 = pl.full([rows, 1], dtype=pl.FP32, value=0.0)
        acc0 = pl.full([kvh, q_tile * group, d], dtype=pl.FP32, value=0.0)
        for kt, (m, l, acc) in pl.range((kv_end + KV_TILE - 1) // KV_TILE, init_values=(m0, l0, acc0)):
            pos = pl.adds(pl.arange(0, [1, KV_TILE], dtype=pl.INT32), kt * KV_TILE)
            idx = cache_rows(table_row, pos, length)
            k = pl.reshape(pl.mgather(k_rows, idx, coalesce="row"), [kvh, KV_TILE, d])
            v = pl.reshape(pl.mgather(v_rows, idx, coalesce="row"), [kvh, KV_TILE, d])
            scores_t = pl.batch_matmul(k, q_t)
            scores = pl.reshape(pl.transpose(scores_t, 1, 2), [kvh, q_tile, group, KV_TILE])
            cap = pl.sel(pl.cmp(pos, visible, cmp_type=2), pl.full([q_tile, KV_TILE], dtype=pl.FP32, value=3.0e38),
                         pl.full([q_tile, KV_TILE], dtype=pl.FP32, value=NEG_CAP))
            capped = pl.minimum(pl.muls(scores, shape.scale), pl.reshape(cap, [q_tile, 1, KV_TILE]))
            s = pl.reshape(capped, [rows, KV_TILE])
            m_new = pl.maximum(m, pl.row_max(s))
            p = pl.exp(pl.row_expand_sub(s, m_new))
            alpha = pl.exp(pl.sub(m, m_new))
            l_new = pl.add(pl.mul(l, alpha), pl.row_sum(p))
            pv = pl.batch_matmul(in_dtype(pl.reshape(p, [kvh, q_tile * group, KV_TILE])), v)
            acc_new = pl.add(pl.mul(acc, pl.reshape(alpha, [kvh, q_tile * group, 1])), pv)
            m_out, l_out, acc_out = pl.yield_(m_new, l_new, acc_new)
        o = pl.row_expand_div(pl.reshape(acc_out, [rows, d]), pl.maxs(l_out, 1.0e-30))
        o = pl.transpose(pl.reshape(o, [kvh, q_tile, group, d]), 0, 1)
        return in_dtype(pl.reshape(o, [q_tile, qh * d]))

    return attend


def longest_length(floor: int = 0):
    """An inline `(seq_lens [B], batch) -> max(floor, seq_lens...)`, each length read from data (a replay reads them
    again). A replay guards each comparison the maximum made: with no floor, which request is the longest (a replay
    misses when another one becomes it); with a floor no length passes, only that each length stays within it."""

    @pl.jit.inline
    def longest(seq_lens, batch):
        for b, (running,) in pl.range(batch, init_values=(floor,)):
            longest_len = pl.yield_(pl.max(running, pl.read(seq_lens, [b])))
        return longest_len

    return longest


def _in_dtype(dt):
    """An inline `x -> x` in dtype dt: x itself when dt is FP32 (a cast to the same dtype copies), else a cast
    rounding to nearest even, as torch and GPU attention kernels round (one conversion; the default mode, half
    away from zero, is emulated in ~50 replayed torch calls)."""
    if dt == pl.FP32:
        @pl.jit.inline
        def as_is(x):
            return x
        return as_is

    @pl.jit.inline
    def cast(x):
        return pl.cast(x, target_type=dt, mode="rint")
    return cast


def _decode_rows(shape: AttnShape, kv_tile: int):
    """An inline `(kt, table64 [B, max_blocks], has_context [B, 1, 1], batch) -> [B, KVH, kv_tile]` row ids of a
    [slots * KVH, D] cache view: entry (b, g, i) is KV head g of position kt * kv_tile + i of request b, through
    its block table (a request with no context reads block 0). Everything but the table is computed from
    constants (a replay keeps it; the block gather's index is checked once, when recorded). A position past the
    table's span gets -2**31 added to its row id (read as an unsigned 32-bit id by the cache gather: past any
    pool), which the gather's bounds check rejects should a length reach it (positions a request does not see
    are replaced before the gather: _attend_tile)."""
    kvh, bs, mb = shape.kv_heads, shape.block_size, shape.max_blocks

    @pl.jit.inline
    def decode_rows(kt, table64, has_context, batch):
        pos = pl.adds(pl.arange(0, [1, kv_tile], dtype=pl.INT64), kt * kv_tile)
        block_of = pl.mins(pl.divs(pl.add(pl.full([batch, kv_tile], dtype=pl.INT64, value=0), pos), bs), mb - 1)
        blocks = pl.reshape(pl.muls(pl.gather(table64, dim=-1, index=block_of), bs * kvh), [batch, 1, kv_tile])
        heads = pl.reshape(pl.arange(0, [1, kvh], dtype=pl.INT64), [1, kvh, 1])
        past_table = pl.muls(pl.cmps(pos, mb * bs, cmp_type=5), -(2 ** 31))
        offsets = pl.add(pl.reshape(pl.add(pl.muls(pl.rems(pos, bs), kvh), past_table), [1, 1, kv_tile]), heads)
        return pl.add(pl.sels(has_context, blocks, scalar=0), offsets)

    return decode_rows


def _attend_tile(shape: AttnShape, kv_tile: int):
    """An inline `(kt, rows [B, KVH, kv_tile], first [B, KVH, 1], q3, lens [B, 1, 1], k_rows, v_rows, batch) ->
    (s, v)`: KV tile kt of every request, its scaled scores s [B * QH, kv_tile] FP32 (positions past a length at
    NEG_CAP) and its values v [B * KVH, kv_tile, D], from one gather per cache and one batched matmul (q3 [B * KVH,
    group, D] against the keys, transposed in the matmul). Positions past a length read the request's first rows
    instead (written whenever it has context; no unwritten slot is read), and are masked."""
    qh, kvh, d = shape.q_heads, shape.kv_heads, shape.head_dim

    @pl.jit.inline
    def attend_tile(kt, rows, first, q3, lens, k_rows, v_rows, batch):
        heads = batch * kvh
        pos = pl.adds(pl.arange(0, [1, 1, kv_tile], dtype=pl.INT32), kt * kv_tile)
        live = pl.cmp(pos, lens, cmp_type=2)
        idx = pl.reshape(pl.sel(live, rows, first), [1, heads * kv_tile])
        k = pl.reshape(pl.mgather(k_rows, idx, coalesce="row"), [heads, kv_tile, d])
        v = pl.reshape(pl.mgather(v_rows, idx, coalesce="row"), [heads, kv_tile, d])
        scores = pl.reshape(pl.matmul(q3, k, b_trans=True), [batch, qh, kv_tile])
        masked = pl.sels(live, pl.muls(scores, shape.scale), scalar=NEG_CAP)
        return pl.reshape(masked, [batch * qh, kv_tile]), v

    return attend_tile


def decode_batcher(shape: AttnShape, kv_tile: int):
    """An inline `(query [B, QH, D], lens [B, 1, 1], longest, table [B, max_blocks], k_rows, v_rows) -> [B, QH, D]`
    in the dtype: every request at once, per KV tile of the longest context (_attend_tile). The first tile starts
    the online softmax (its running max, sum and output are that tile's own: no rescaling of an empty start), the
    loop folds in the others; a batch whose lengths are all 0 still runs the first tile, and its rows are zeroed.
    kernels.decoder's one-token kernels call it too."""
    qh, kvh, d, group, dt = shape.q_heads, shape.kv_heads, shape.head_dim, shape.group, shape.dtype
    decode_rows, attend_tile, in_dtype = _decode_rows(shape, kv_tile), _attend_tile(shape, kv_tile), _in_dtype(dt)

    @pl.jit.inline
    def decode_batch(query, lens, longest_len, table, k_rows, v_rows, batch):
        heads = batch * kvh
        q3 = pl.reshape(query, [heads, group, d])
        table64 = pl.cast(table, target_type=pl.INT64)      # index math in INT64: no INT32 round trip per op
        has_context = pl.cmps(lens, 0, cmp_type=4)
        rows0 = decode_rows(0, table64, has_context, batch)
        first = rows0[:, :, 0:1]
        s0, v0 = attend_tile(0, rows0, first, q3, lens, k_rows, v_rows, batch)
        m0 = pl.row_max(s0)
        p0 = pl.exp(pl.row_expand_sub(s0, m0))
        l0 = pl.row_sum(p0)
        acc0 = pl.batch_matmul(in_dtype(pl.reshape(p0, [heads, group, kv_tile])), v0)
        for kt, (m, l, acc) in pl.range(1, (longest_len + kv_tile - 1) // kv_tile, init_values=(m0, l0, acc0)):
            rows = decode_rows(kt, table64, has_context, batch)
            s, v = attend_tile(kt, rows, first, q3, lens, k_rows, v_rows, batch)
            m_new = pl.maximum(m, pl.row_max(s))
            p = pl.exp(pl.row_expand_sub(s, m_new))
            alpha = pl.exp(pl.sub(m, m_new))
            l_new = pl.add(pl.mul(l, alpha), pl.row_sum(p))
            pv = pl.batch_matmul(in_dtype(pl.reshape(p, [heads, group, kv_tile])), v)
            acc_new = pl.add(pl.mul(acc, pl.reshape(alpha, [heads, group, 1])), pv)
            m_out, l_out, acc_out = pl.yield_(m_new, l_new, acc_new)
        o = pl.row_expand_div(pl.reshape(acc_out, [batch * qh, d]), l_out)   # l >= 1: a row's maximum adds exp(0)
        return in_dtype(pl.sels(has_context, pl.reshape(o, [batch, qh, d]), scalar=0.0))

    return decode_batch


@functools.lru_cache(maxsize=None)
def decode_kernel(shape: AttnShape, kv_tile: int = KV_TILE):
    """The decode kernel over KV tiles of kv_tile positions (decode_tile picks it per call). Lengths up to kv_tile
    run one tile and replay whichever request is the longest (the tile is the longest length's floor)."""
    qh, kvh, d, bs, mb, dt = (shape.q_heads, shape.kv_heads, shape.head_dim, shape.block_size, shape.max_blocks,
                              shape.dtype)
    longest, decode_batch = longest_length(kv_tile), decode_batcher(shape, kv_tile)

    @pl.jit
    def paged_decode_attention(
        query: pl.Tensor[[B_DYN, qh, d], dt],
        key_cache: pl.Tensor[[NB_DYN, bs, kvh, d], dt],
        value_cache: pl.Tensor[[NB_DYN, bs, kvh, d], dt],
        block_tables: pl.Tensor[[B_DYN, mb], pl.INT32],
        seq_lens: pl.Tensor[[B_DYN], pl.INT32],
        out: pl.Out[pl.Tensor[[B_DYN, qh, d], dt]],
    ):
        query.bind_dynamic(0, B_DYN)
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
        block_tables.bind_dynamic(0, B_DYN)
        seq_lens.bind_dynamic(0, B_DYN)
        out.bind_dynamic(0, B_DYN)
        batch = pl.tensor.dim(query, 0)
        slot_rows = pl.tensor.dim(key_cache, 0) * bs * kvh
        k_rows = pl.reshape(key_cache, [slot_rows, d])
        v_rows = pl.reshape(value_cache, [slot_rows, d])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="paged_decode_attention"):
            lens = pl.reshape(seq_lens, [batch, 1, 1])
            out[:, :, :] = decode_batch(query, lens, longest(seq_lens, batch), block_tables, k_rows, v_rows, batch)
        return out

    return paged_decode_attention


def decode_tile(block_size: int, max_seq_len: int | None) -> int:
    """The KV tile of a decode call whose lengths are at most max_seq_len (the host's number): the smallest power
    of two from the block size's up to KV_TILE that holds it, so a short context gathers a short tile and a call
    compiles and records one kernel per bucket; KV_TILE when the host gives no bound."""
    if max_seq_len is None:
        return KV_TILE
    need = max(max_seq_len, block_size, 1)
    return min(KV_TILE, 1 << (need - 1).bit_length())


@functools.lru_cache(maxsize=None)
def prefill_kernel(shape: AttnShape):
    qh, kvh, d, bs, mb, dt = (shape.q_heads, shape.kv_heads, shape.head_dim, shape.block_size, shape.max_blocks,
                              shape.dtype)
    q_tile = Q_TILE
    attend = _attend(shape, q_tile)

    @pl.jit
    def chunked_prefill_attention(
        query: pl.Tensor[[T_DYN, qh, d], dt],
        key_cache: pl.Tensor[[NB_DYN, bs, kvh, d], dt],
        value_cache: pl.Tensor[[NB_DYN, bs, kvh, d], dt],
        block_tables: pl.Tensor[[B_DYN, mb], pl.INT32],
        seq_lens: pl.Tensor[[B_DYN], pl.INT32],
        query_start_loc: pl.Tensor[[QSL_DYN], pl.INT32],
        out: pl.Out[pl.Tensor[[T_DYN, qh, d], dt]],
    ):
        query.bind_dynamic(0, T_DYN)
        key_cache.bind_dynamic(0, NB_DYN)
        value_cache.bind_dynamic(0, NB_DYN)
        block_tables.bind_dynamic(0, B_DYN)
        seq_lens.bind_dynamic(0, B_DYN)
        query_start_loc.bind_dynamic(0, QSL_DYN)
        out.bind_dynamic(0, T_DYN)
        tokens = pl.tensor.dim(query, 0)
        batch = pl.tensor.dim(block_tables, 0)
        slot_rows = pl.tensor.dim(key_cache, 0) * bs * kvh
        k_rows = pl.reshape(key_cache, [slot_rows, d])
        v_rows = pl.reshape(value_cache, [slot_rows, d])
        q_flat = pl.reshape(query, [tokens, qh * d])
        out_flat = pl.reshape(out, [tokens, qh * d])
        with pl.at(level=pl.Level.CORE_GROUP, name_hint="chunked_prefill_clear"):
            out_flat[:, :] = pl.full([tokens, qh * d], dtype=dt, value=0.0)     # rows of no request stay zero
        for b in pl.spmd(batch, name_hint="chunked_prefill_attention"):
            length = pl.read(seq_lens, [b])
            first = pl.read(query_start_loc, [b])
            q_len = pl.read(query_start_loc, [b + 1]) - first
            for qt in pl.range((q_len + q_tile - 1) // q_tile):
                rows = pl.mins(pl.adds(pl.arange(0, [1, q_tile], dtype=pl.INT32), first + qt * q_tile),
                               first + q_len - 1)
                q_rows = pl.mgather(q_flat, rows, coalesce="row")
                o = attend(q_rows, length - q_len + qt * q_tile, length, block_tables[b : b + 1, :], k_rows, v_rows)
                out_flat = pl.scatter_update(out_flat, 0, rows, o)
        return out

    return chunked_prefill_attention
