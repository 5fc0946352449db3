"""Triton kernels for the row-wise ops: RMSNorm (+ residual), rotary, SiLU-and-mul, KV write.

Every kernel loads in the storage dtype, upcasts to float32 right after the load, and
rounds once on the store, which is what the torch reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8 if block <= 8192 else 16


@triton.jit
def _rms_norm_kernel(
    x_ptr, x_stride, res_ptr, res_stride, sum_ptr, w_ptr, out_ptr,
    n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(sum_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * n_cols + cols, summed, mask=mask)
        x = summed.to(tl.float32)  # normalise the rounded sum, as the reference does
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * (1.0 / tl.sqrt(mean_sq + eps)) * w
    tl.store(out_ptr + row * n_cols + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm over the last dim of a 2-D ``x`` (rows may be strided); with ``residual``,
    return ``(norm(x + residual), x + residual)``."""
    rows, n_cols = x.shape
    out = torch.empty((rows, n_cols), dtype=x.dtype, device=x.device)
    summed = torch.empty_like(out) if residual is not None else out
    block = triton.next_power_of_2(n_cols)
    if rows:
        _rms_norm_kernel[(rows,)](
            x, x.stride(0), residual if residual is not None else x,
            residual.stride(0) if residual is not None else 0, summed, weight, out,
            n_cols, eps, HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=_warps(block),
        )  # fmt: skip
    return out if residual is None else (out, summed)


@triton.jit
def _silu_and_mul_kernel(x_ptr, x_stride, out_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * d + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[:, :d]) * x[:, d:]`` for a 2-D ``x [T, 2d]``."""
    rows, width = x.shape
    d = width // 2
    out = torch.empty((rows, d), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(d))
    if rows:
        _silu_and_mul_kernel[(rows, triton.cdiv(d, block))](
            x, x.stride(0), out, d, BLOCK=block, num_warps=_warps(block)
        )
    return out


@triton.jit
def _rotate(
    pos, cache_ptr, cache_stride, x_ptr, x_tok_stride, x_head_stride, out_ptr, tok,
    num_heads, half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < half
    cos = tl.load(cache_ptr + pos * cache_stride + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_ptr + pos * cache_stride + half + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    for h0 in range(0, num_heads, BLOCK_H):
        heads = h0 + tl.arange(0, BLOCK_H)
        mask = (heads < num_heads)[:, None] & d_mask[None, :]
        src = x_ptr + tok * x_tok_stride + heads[:, None] * x_head_stride + d[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=mask, other=0.0).to(tl.float32)
        dst = out_ptr + (tok * num_heads + heads[:, None]) * (2 * half) + d[None, :]
        tl.store(dst, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + half, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    pos_ptr, cache_ptr, cache_stride,
    q_ptr, q_tok_stride, q_head_stride, q_out_ptr, num_q_heads,
    k_ptr, k_tok_stride, k_head_stride, k_out_ptr, num_k_heads,
    half, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    _rotate(pos, cache_ptr, cache_stride, q_ptr, q_tok_stride, q_head_stride, q_out_ptr, tok,
            num_q_heads, half, BLOCK_H, BLOCK_HALF)  # fmt: skip
    _rotate(pos, cache_ptr, cache_stride, k_ptr, k_tok_stride, k_head_stride, k_out_ptr, tok,
            num_k_heads, half, BLOCK_H, BLOCK_HALF)  # fmt: skip


def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor):
    """NeoX rotate-half of ``q [T, Hq, D]`` and ``k [T, Hk, D]`` into new contiguous tensors."""
    tokens, num_q_heads, head_size = q.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    half = head_size // 2
    block_half = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(max(num_q_heads, k.shape[1])), 4096 // block_half))
    if tokens:
        _rotary_kernel[(tokens,)](
            positions, cos_sin_cache, cos_sin_cache.stride(0),
            q, q.stride(0), q.stride(1), q_out, num_q_heads,
            k, k.stride(0), k.stride(1), k_out, k.shape[1],
            half, BLOCK_H=block_h, BLOCK_HALF=block_half, num_warps=_warps(block_h * block_half),
        )  # fmt: skip
    return q_out, k_out


@triton.jit
def _write_kv_kernel(
    k_ptr, k_tok_stride, k_head_stride, v_ptr, v_tok_stride, v_head_stride,
    kc_ptr, vc_ptr, c_block_stride, c_slot_stride, c_head_stride, slot_ptr,
    block_size, num_heads, head_size, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:  # negative slots are padding tokens: never written
        block = slot // block_size
        offset = slot % block_size
        d = tl.arange(0, BLOCK_D)
        for h0 in range(0, num_heads, BLOCK_H):
            heads = h0 + tl.arange(0, BLOCK_H)
            mask = (heads < num_heads)[:, None] & (d < head_size)[None, :]
            k = tl.load(k_ptr + tok * k_tok_stride + heads[:, None] * k_head_stride + d[None, :], mask=mask)
            v = tl.load(v_ptr + tok * v_tok_stride + heads[:, None] * v_head_stride + d[None, :], mask=mask)
            dst = block * c_block_stride + offset * c_slot_stride + heads[:, None] * c_head_stride + d[None, :]
            tl.store(kc_ptr + dst, k.to(kc_ptr.dtype.element_ty), mask=mask)
            tl.store(vc_ptr + dst, v.to(vc_ptr.dtype.element_ty), mask=mask)


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Store ``k, v [T, Hk, D]`` at flat cache slots; negative slots are skipped."""
    tokens, num_heads, head_size = k.shape
    block_d = triton.next_power_of_2(head_size)
    block_h = max(1, min(triton.next_power_of_2(num_heads), 4096 // block_d))
    if tokens:
        _write_kv_kernel[(tokens,)](
            k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1),
            k_cache, v_cache, k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), slot_mapping,
            k_cache.shape[1], num_heads, head_size, BLOCK_H=block_h, BLOCK_D=block_d,
            num_warps=_warps(block_h * block_d),
        )  # fmt: skip


@triton.jit
def _token_bitmask_kernel(logits_ptr, logits_stride, bitmask_ptr, words, rows_ptr, vocab, BLOCK: tl.constexpr):
    index = tl.program_id(0).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = tokens < vocab
    word = tl.load(bitmask_ptr + index * words + tokens // 32, mask=inside, other=-1)
    forbidden = ((word >> (tokens % 32)) & 1) == 0
    row = tl.load(rows_ptr + index)
    tl.store(logits_ptr + row * logits_stride + tokens, float("-inf"), mask=inside & forbidden)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """``logits[rows[j], t] = -inf`` where bit ``t % 32`` of ``bitmask[j, t // 32]`` is 0 (all on the device)."""
    vocab = logits.shape[1]
    block = min(1024, triton.next_power_of_2(vocab))
    if rows.numel():
        _token_bitmask_kernel[(rows.numel(), triton.cdiv(vocab, block))](
            logits, logits.stride(0), bitmask, bitmask.shape[1], rows, vocab, BLOCK=block, num_warps=_warps(block)
        )
