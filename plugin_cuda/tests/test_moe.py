"""The Triton fused MoE (plugins.gpu_triton.moe) against the SDK's torch default.

Off-GPU under Triton's interpreter in fp32 and fp16 (bf16 arithmetic is wrong in the
interpreter); on a GPU natively, bf16 and a prefill-sized batch included (marked ``gpu``).
"""

from __future__ import annotations

import pytest
import torch
from plugins.gpu_triton.kernels import TritonKernels
from plugins.kernels import Kernels
from plugins.moe import ExpertWeights

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
TOL = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 3e-2}
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
REF = Kernels()


def routed(num_tokens, num_experts, top_k, hidden, inter, dtype, seed=0, skip_expert=None):
    """Random ``x``, experts and routing (distinct experts per token; ``skip_expert`` gets no token)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)

    x = rand(num_tokens, hidden)
    experts = ExpertWeights(rand(num_experts, 2 * inter, hidden, scale=hidden**-0.5),
                            rand(num_experts, hidden, inter, scale=inter**-0.5), num_experts)  # fmt: skip
    logits = torch.randn((num_tokens, num_experts), generator=gen)
    if skip_expert is not None:
        logits[:, skip_expert] = -float("inf")
    weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
    return x, experts, weights.to(DEVICE), ids.to(DEVICE)


@pytest.fixture(scope="module")
def kernels() -> TritonKernels:
    return TritonKernels()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,hidden,inter",
    # decode (one token), a few tokens, an expert with several 16-pair blocks, sizes off the tiles
    [(1, 8, 2, 64, 32), (5, 4, 2, 48, 40), (40, 4, 2, 32, 64), (9, 8, 3, 100, 72)],
)
def test_fused_moe_matches_the_torch_default(kernels, dtype, num_tokens, num_experts, top_k, hidden, inter):
    x, experts, weights, ids = routed(num_tokens, num_experts, top_k, hidden, inter, dtype, seed=num_tokens)
    prepared = kernels.prepare_experts(experts, None)
    got = kernels.fused_moe(x, prepared, weights, ids)
    want = REF.fused_moe(x, experts, weights, ids)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=TOL[dtype], rtol=TOL[dtype])


def test_unused_experts_and_strided_rows(kernels):
    """An expert no token picked, and ``x`` rows strided (a view of a wider tensor)."""
    x, experts, weights, ids = routed(6, 4, 2, 32, 32, torch.float32, seed=3, skip_expert=2)
    wide = torch.zeros(6, 64, device=DEVICE)
    wide[:, :32] = x
    got = kernels.fused_moe(wide[:, :32], kernels.prepare_experts(experts, None), weights, ids)
    torch.testing.assert_close(got.cpu(), REF.fused_moe(x, experts, weights, ids).cpu(), atol=1e-4, rtol=1e-4)


def test_no_tokens(kernels):
    x, experts, weights, ids = routed(0, 4, 2, 32, 32, torch.float32)
    assert kernels.fused_moe(x, kernels.prepare_experts(experts, None), weights, ids).shape == (0, 32)


@pytest.mark.parametrize("block_m", [16, 64])
def test_align_by_expert_blocks_hold_one_expert_and_every_pair_once(block_m):
    from plugins.gpu_triton.moe import align_by_expert

    num_experts, top_k = 6, 2
    gen = torch.Generator().manual_seed(block_m)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(50)])
    sorted_ids, block_experts, num_padded = align_by_expert(ids.to(DEVICE), num_experts, block_m)
    sorted_ids, block_experts, used = sorted_ids.cpu(), block_experts.cpu(), int(num_padded)
    flat = ids.reshape(-1)
    assert used % block_m == 0
    assert sorted(sorted_ids[sorted_ids < flat.numel()].tolist()) == list(range(flat.numel()))
    assert (sorted_ids[used:] == flat.numel()).all()  # slots past the used blocks are padding
    for block in range(used // block_m):
        pairs = sorted_ids[block * block_m : (block + 1) * block_m]
        pairs = pairs[pairs < flat.numel()]
        assert len(pairs) and (flat[pairs] == block_experts[block]).all(), block


def test_gguf_experts_take_the_reference(kernels):
    """Quantized (GGUF) stacks are not the kernel's: the reference runs them, as prepare_experts keeps them."""
    import gguf
    import numpy as np
    from plugins.kernels import GGUFWeight

    q8 = gguf.GGMLQuantizationType.Q8_0
    x, experts, weights, ids = routed(3, 4, 2, 32, 32, torch.float32)
    stacks = {}
    for name in ("gate_up", "down"):
        dense = getattr(experts, name).cpu().reshape(-1, 32).numpy().astype(np.float32)
        stacks[name] = GGUFWeight("Q8_0", torch.from_numpy(gguf.quants.quantize(dense, q8)), dense.shape[0], 32)
    quantized = ExpertWeights(stacks["gate_up"], stacks["down"], 4)
    prepared = kernels.prepare_experts(quantized, "gguf")
    assert prepared is quantized
    torch.testing.assert_close(kernels.fused_moe(x.cpu(), prepared, weights.cpu(), ids.cpu()),
                               REF.fused_moe(x.cpu(), quantized, weights.cpu(), ids.cpu()))  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_prefill_sized_batch_takes_the_large_tiles(kernels, dtype):
    from plugins.gpu_triton.moe import LARGE_TILES, tiles

    x, experts, weights, ids = routed(2048, 8, 2, 1024, 768, dtype)
    assert tiles(2048 * 2, 8, dtype) == LARGE_TILES[2]
    got = kernels.fused_moe(x, kernels.prepare_experts(experts, None), weights, ids)
    want = REF.fused_moe(x, experts, weights, ids)
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])
