"""Fused mixture-of-experts products: every (token, expert) pair of a batch through one grouped GEMM kernel.

The pairs are sorted by expert and each expert's run is padded to whole blocks of
``BLOCK_M`` pairs (:func:`align_by_expert`: torch ops on the device, no host sync, so a CUDA
graph can capture it; the grid is sized by the most blocks any routing of the batch can
need and the blocks past the used ones return at once). :func:`_grouped_gemm_kernel` runs
over (block of pairs, block of output columns): a program reads its block's expert, gathers
its pairs' input rows and multiplies them by that expert's weight rows. A MoE layer runs it
twice (the shape of vLLM's fused_moe):

1. gate/up (``GATED``): the gate and the up accumulators of the same columns side by side,
   ``silu(gate) * up`` in the epilogue, one row per pair (``[pairs, I]``, the activations' dtype);
2. down: those rows times the expert's down rows, scaled by the pair's routing weight, one
   float32 row per pair (``[pairs, H]``); the ``top_k`` rows of each token are summed after.

Accumulation is float32 (float32 inputs multiplied as IEEE float32, not TF32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: ``(block_m, block_n, block_k, num_warps)`` by the activations' bytes per value: 16-pair blocks
#: while each expert has few pairs (decode), 64-pair blocks once the average expert has 64
SMALL_TILES = {2: (16, 64, 64, 4), 4: (16, 64, 32, 4)}
LARGE_TILES = {2: (64, 64, 32, 4), 4: (64, 64, 16, 4)}


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, a_stride, w_ptr, w_stride_e, w_stride_n, out_ptr, out_stride,
    sorted_ids_ptr, block_experts_ptr, num_padded_ptr, weights_ptr,
    N, K, num_pairs, pairs_per_row,
    GATED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    if block * BLOCK_M >= tl.load(num_padded_ptr):
        return
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    pairs = tl.load(sorted_ids_ptr + block * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    pairs = tl.where(valid, pairs, 0).to(tl.int64)
    a_rows = a_ptr + (pairs // pairs_per_row)[:, None] * a_stride  # the pair's token (or its own row)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < N
    w_cols = w_ptr + expert * w_stride_e + n[None, :].to(tl.int64) * w_stride_n
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        a = tl.load(a_rows + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & n_mask[None, :]
        w = tl.load(w_cols + k[:, None], mask=w_mask, other=0.0)
        acc = tl.dot(a, w, acc, input_precision="ieee")
        if GATED:  # the up rows of the same columns lie N rows further on
            w_up = tl.load(w_cols + N * w_stride_n + k[:, None], mask=w_mask, other=0.0)
            acc_up = tl.dot(a, w_up, acc_up, input_precision="ieee")
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    else:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    out = out_ptr + pairs[:, None] * out_stride + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & n_mask[None, :])


def tiles(num_pairs: int, num_experts: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """``(block_m, block_n, block_k, num_warps)`` for ``num_pairs`` routed pairs over ``num_experts``."""
    size = torch.finfo(dtype).bits // 8
    return (LARGE_TILES if num_pairs >= 64 * num_experts else SMALL_TILES)[min(size, 4)]


def align_by_expert(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pairs of ``topk_ids [T, k]`` (pair ``p`` is token ``p // k``'s ``p % k``-th expert) sorted by
    expert, each expert's run padded to a multiple of ``block_m``.

    Returns ``(sorted_ids, block_experts, num_padded)``, int32 on ``topk_ids``' device:
    ``sorted_ids`` holds pair indices, ``T * k`` in the padding, for as many blocks as any
    routing of ``T * k`` pairs can fill; ``block_experts[b]`` is block ``b``'s expert;
    ``num_padded`` (one element) the slots the used blocks hold.
    """
    flat = topk_ids.reshape(-1)
    num_pairs, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank_in_run = torch.arange(num_pairs, device=device) - (counts.cumsum(0) - counts)[experts]
    slots = (padded_end - padded)[experts] + rank_in_run
    max_blocks = triton.cdiv(num_pairs + min(num_experts, num_pairs) * (block_m - 1), block_m)
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    sorted_ids[slots] = order.to(torch.int32)
    starts = torch.arange(max_blocks, device=device) * block_m
    block_experts = torch.searchsorted(padded_end, starts, right=True).clamp_(max=num_experts - 1)
    return sorted_ids, block_experts.to(torch.int32), padded_end[-1:].to(torch.int32)


def fused_moe(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * down_e(silu(gate_e x[t]) * up_e x[t])`` with ``e = topk_ids[t, k]``.

    ``x [T, H]`` (unit last stride), contiguous ``gate_up [E, 2I, H]`` (each expert's gate rows,
    then its up rows) and ``down [E, H, I]`` in ``x``'s dtype; float32 ``topk_weights [T, k]``;
    returns ``[T, H]`` in ``x``'s dtype.
    """
    num_tokens, hidden = x.shape
    num_experts, inter = gate_up.shape[0], gate_up.shape[1] // 2
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_pairs == 0:
        return torch.zeros_like(x)
    block_m, block_n, block_k, warps = tiles(num_pairs, num_experts, x.dtype)
    sorted_ids, block_experts, num_padded = align_by_expert(topk_ids, num_experts, block_m)
    num_blocks = sorted_ids.numel() // block_m
    weights = topk_weights.reshape(-1).to(torch.float32).contiguous()
    hidden_rows = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)
    pair_out = torch.empty((num_pairs, hidden), dtype=torch.float32, device=x.device)
    tile = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps)
    _grouped_gemm_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, x.stride(0), gate_up, gate_up.stride(0), gate_up.stride(1), hidden_rows, hidden_rows.stride(0),
        sorted_ids, block_experts, num_padded, weights, inter, hidden, num_pairs, top_k, GATED=True, **tile,
    )  # fmt: skip
    _grouped_gemm_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        hidden_rows, hidden_rows.stride(0), down, down.stride(0), down.stride(1), pair_out, pair_out.stride(0),
        sorted_ids, block_experts, num_padded, weights, hidden, inter, num_pairs, 1, GATED=False, **tile,
    )  # fmt: skip
    return pair_out.view(num_tokens, top_k, hidden).sum(dim=1).to(x.dtype)
