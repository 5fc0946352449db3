"""Triton paged attention over the flattened batch layout of :mod:`plugins.attention`.

Two paths:

- ``prefill``: any mix of query lengths. One program per (sequence, tile of
  ``BLOCK_M`` queries, query head) runs flash attention over the sequence's cached
  keys up to its causal limit, looking each key's block up in the block table.
- ``decode``: every sequence has one query. One program per (sequence, KV head,
  split) attends all ``group`` query heads of a KV head at once over one part of
  the context (split-K / flash-decoding), and a second kernel merges the parts with
  their log-sum-exp. Both read lengths only from device tensors, and their grids
  depend only on host sizes, so they can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from plugins.gpu_triton.splits import DecodeSplits

LOG2E = 1.4426950408889634


@triton.jit
def _load_kv_tile(cache_ptr, table_ptr, offs_n, n_mask, kv_head, offs_d, d_mask, block_size,
                  block_stride, slot_stride, head_stride):  # fmt: skip
    block = tl.load(table_ptr + offs_n // block_size, mask=n_mask, other=0).to(tl.int64)
    ptrs = cache_ptr + block[:, None] * block_stride + (offs_n % block_size)[:, None] * slot_stride
    ptrs += kv_head * head_stride + offs_d[None, :]
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache, v_cache, out_ptr, block_tables, query_start_loc, seq_lens,
    q_tok_stride, q_head_stride, o_tok_stride, o_head_stride,
    block_stride, slot_stride, head_stride, table_stride,
    qk_scale, block_size, head_size, group,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0)
    m_block = tl.program_id(1)
    head = tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    if m_block * BLOCK_M < q_len:
        context = tl.load(seq_lens + seq) - q_len  # keys before this step's first query
        kv_head = head // group
        table = block_tables + seq.to(tl.int64) * table_stride
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < head_size
        rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * q_tok_stride + head * q_head_stride + offs_d[None, :],
            mask=m_mask[:, None] & d_mask[None, :], other=0.0,
        )  # fmt: skip
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        kv_end = context + tl.minimum(q_len, (m_block + 1) * BLOCK_M)  # causal limit of the tile's last row
        for start in range(0, kv_end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            n_mask = offs_n < kv_end
            k = _load_kv_tile(k_cache, table, offs_n, n_mask, kv_head, offs_d, d_mask, block_size,
                              block_stride, slot_stride, head_stride)  # fmt: skip
            # "ieee": fp32 models must not drop to TF32; for bf16/fp16 operands it compiles to
            # the same PTX as "tf32", and it is the one precision every AMD target takes
            # (gfx90a rejects "tf32")
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            visible = (offs_n[None, :] <= (context + offs_m)[:, None]) & n_mask[None, :]
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: key 0 is visible to every row
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = _load_kv_tile(v_cache, table, offs_n, n_mask, kv_head, offs_d, d_mask, block_size,
                              block_stride, slot_stride, head_stride)  # fmt: skip
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + rows[:, None] * o_tok_stride + head * o_head_stride + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :],
        )  # fmt: skip


@triton.jit
def _decode_kernel(
    q_ptr, k_cache, v_cache, out_ptr, block_tables, seq_lens, part_acc, part_ml,
    q_tok_stride, q_head_stride, o_tok_stride, o_head_stride,
    block_stride, slot_stride, head_stride, table_stride,
    qk_scale, block_size, head_size, group, num_heads, tokens_per_split, num_splits,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens + seq)
    start = split * tokens_per_split
    end = tl.minimum(seq_len, start + tokens_per_split)
    if SINGLE_SPLIT or start < end:  # the reduce step never reads empty splits
        table = block_tables + seq * table_stride
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        g_mask = offs_g < group
        d_mask = offs_d < head_size
        heads = kv_head * group + offs_g
        q = tl.load(
            q_ptr + seq * q_tok_stride + heads[:, None] * q_head_stride + offs_d[None, :],
            mask=g_mask[:, None] & d_mask[None, :], other=0.0,
        )  # fmt: skip
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            n_mask = offs_n < end
            k = _load_kv_tile(k_cache, table, offs_n, n_mask, kv_head, offs_d, d_mask, block_size,
                              block_stride, slot_stride, head_stride)  # fmt: skip
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            s = tl.where(n_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = _load_kv_tile(v_cache, table, offs_n, n_mask, kv_head, offs_d, d_mask, block_size,
                              block_stride, slot_stride, head_stride)  # fmt: skip
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
            m_i = m_new
        mask = g_mask[:, None] & d_mask[None, :]
        if SINGLE_SPLIT:
            out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # seq_len 0 (padding) gives zeros
            dst = out_ptr + seq * o_tok_stride + heads[:, None] * o_head_stride + offs_d[None, :]
            tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=mask)
        else:
            row = (seq * num_heads + heads) * num_splits + split  # layout [seq, head, split]
            tl.store(part_acc + row[:, None] * BLOCK_D + offs_d[None, :], acc, mask=mask)
            tl.store(part_ml + row * 2, m_i, mask=g_mask)
            tl.store(part_ml + row * 2 + 1, l_i, mask=g_mask)


@triton.jit
def _reduce_kernel(
    out_ptr, seq_lens, part_acc, part_ml, o_tok_stride, o_head_stride,
    head_size, num_heads, tokens_per_split, num_splits,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    used = tl.cdiv(tl.load(seq_lens + seq), tokens_per_split)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < used
    row = (seq * num_heads + head) * num_splits + offs_s
    m = tl.load(part_ml + row * 2, mask=s_mask, other=float("-inf"))
    l = tl.load(part_ml + row * 2 + 1, mask=s_mask, other=0.0)  # noqa: E741
    m_max = tl.maximum(tl.max(m, axis=0), -1e30)  # finite even with no used split (seq_len 0)
    weight = tl.where(s_mask, tl.exp2(m - m_max), 0.0)
    total = tl.sum(l * weight, axis=0)
    d_mask = offs_d < head_size
    acc = tl.load(
        part_acc + row[:, None] * BLOCK_D + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0
    )
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    dst = out_ptr + seq * o_tok_stride + head * o_head_stride + offs_d
    tl.store(dst, out.to(out_ptr.dtype.element_ty), mask=d_mask)


def _cache_strides(k_cache: torch.Tensor) -> tuple[int, int, int]:
    return k_cache.stride(0), k_cache.stride(1), k_cache.stride(2)


def prefill_attention(q, k_cache, v_cache, meta, scale: float, block_m: int, block_n: int) -> torch.Tensor:
    """Attention of a batch with any query lengths; ``q [T, Hq, D]`` -> ``[T, Hq, D]``."""
    tokens, num_heads, head_size = q.shape
    out = torch.empty((tokens, num_heads, head_size), dtype=q.dtype, device=q.device)
    if tokens == 0:
        return out
    grid = (meta.num_seqs, triton.cdiv(meta.max_query_len, block_m), num_heads)
    _prefill_kernel[grid](
        q, k_cache, v_cache, out, meta.block_tables, meta.query_start_loc, meta.seq_lens,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(k_cache), meta.block_tables.stride(0),
        scale * LOG2E, k_cache.shape[1], head_size, num_heads // k_cache.shape[2],
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(head_size)),
        num_warps=4,
    )  # fmt: skip
    return out


def decode_attention(q, k_cache, v_cache, meta, scale: float, splits: DecodeSplits, block_n: int) -> torch.Tensor:
    """Attention of a batch of one query per sequence (split-K over the context)."""
    num_seqs, num_heads, head_size = q.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty((num_seqs, num_heads, head_size), dtype=q.dtype, device=q.device)
    if num_seqs == 0:
        return out
    block_d = max(16, triton.next_power_of_2(head_size))
    single = splits.num_splits == 1
    rows = 1 if single else num_seqs * num_heads * splits.num_splits
    part_acc = torch.empty((rows, block_d), dtype=torch.float32, device=q.device)
    part_ml = torch.empty((rows, 2), dtype=torch.float32, device=q.device)
    _decode_kernel[(num_seqs, num_kv_heads, splits.num_splits)](
        q, k_cache, v_cache, out, meta.block_tables, meta.seq_lens, part_acc, part_ml,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(k_cache), meta.block_tables.stride(0),
        scale * LOG2E, k_cache.shape[1], head_size, group, num_heads,
        splits.tokens_per_split, splits.num_splits,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        SINGLE_SPLIT=single, num_warps=4,
    )  # fmt: skip
    if not single:
        _reduce_kernel[(num_seqs, num_heads)](
            out, meta.seq_lens, part_acc, part_ml, out.stride(0), out.stride(1),
            head_size, num_heads, splits.tokens_per_split, splits.num_splits,
            BLOCK_S=triton.next_power_of_2(splits.num_splits), BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out
