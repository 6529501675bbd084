"""Torch goldens for the paged-attention kernels, written from vLLM's published semantics (reshape_and_cache,
paged decode and chunked-prefill attention), not from the kernels. Same signatures as the kernels' wrappers;
softmax in FP32, one request at a time, over the context gathered token by token through the block table."""
from __future__ import annotations

import torch


def write_kv_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """key/value [N, KVH, D] into caches [num_blocks, block_size, KVH, D] at slot_mapping [N]; -1 skipped."""
    block_size = key_cache.shape[1]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            key_cache[slot // block_size, slot % block_size] = key[i]
            value_cache[slot // block_size, slot % block_size] = value[i]


def _context(cache, table_row, length: int) -> torch.Tensor:
    """[length, KVH, D] FP32: positions 0..length-1 read through one request's block table row."""
    block_size = cache.shape[1]
    pos = torch.arange(length)
    blocks = table_row[pos // block_size].long()
    return cache[blocks, pos % block_size].float()


def _attend(q, k, v, q_pos, scale: float) -> torch.Tensor:
    """q [n, QH, D] at absolute positions q_pos [n] over k/v [L, KVH, D]: causal, GQA, FP32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * scale
    visible = torch.arange(k.shape[0])[None, :] <= q_pos[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)


def paged_decode_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale=None, out=None,
                           max_seq_len=None):
    """query [B, QH, D] -> [B, QH, D]: request b attends to positions 0..seq_lens[b]-1; seq_lens[b] == 0: zeros.
    (max_seq_len, the kernel's tile hint, changes nothing here.)"""
    qsl = torch.arange(query.shape[0] + 1, dtype=torch.int32)
    return chunked_prefill_attention(query, key_cache, value_cache, block_tables, seq_lens, qsl, scale=scale,
                                     out=out)


def chunked_prefill_attention(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, *,
                              scale=None, out=None):
    """query [T, QH, D] packed: request b's rows qsl[b]:qsl[b+1] sit at positions seq_lens[b] - qlen ..
    seq_lens[b] - 1 and attend causally to the cached context plus the chunk."""
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    result = torch.zeros(query.shape, dtype=torch.float32)
    for b, length in enumerate(seq_lens.tolist()):
        lo, hi = int(query_start_loc[b]), int(query_start_loc[b + 1])
        if length == 0 or hi == lo:
            continue
        k = _context(key_cache, block_tables[b], length)
        v = _context(value_cache, block_tables[b], length)
        q_pos = torch.arange(length - (hi - lo), length)
        result[lo:hi] = _attend(query[lo:hi], k, v, q_pos, scale)
    out = torch.empty_like(query) if out is None else out
    out.copy_(result)
    return out
