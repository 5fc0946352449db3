"""The SDK's grouped MoE reference against a per-token loop, dense and GGUF experts."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from plugins.kernels import Kernels
from plugins.moe import ExpertWeights, grouped_experts
from plugins.reference import random_gguf_weight


def per_token(x, gate_up, down, weights, ids) -> torch.Tensor:
    """One token and one expert at a time, in float64."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(weights[t].tolist(), ids[t].tolist(), strict=True):
            gate, up = (gate_up[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (down[e].double() @ (F.silu(gate) * up))
    return out


def routing(num_tokens, num_experts, top_k, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(num_tokens, num_experts, generator=g)
    weights, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return weights, ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "experts", "top_k"), [(1, 4, 2), (7, 8, 3), (33, 4, 1)])
def test_grouped_matches_per_token(tokens, experts, top_k, dtype):
    g = torch.Generator().manual_seed(1)
    hidden, inter = 64, 32
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.2).to(dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.2).to(dtype)
    weights, ids = routing(tokens, experts, top_k)
    out = Kernels().fused_moe(x, ExpertWeights(gate_up, down, experts), weights, ids)
    assert out.dtype == dtype and out.shape == x.shape
    expected = per_token(x, gate_up, down, weights, ids)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), expected, atol=tol * expected.abs().max().item(), rtol=0)


def test_gguf_experts_are_sliced_by_rows():
    experts, hidden, inter = 3, 64, 32
    gate_up = random_gguf_weight("Q8_0", experts * 2 * inter, hidden, seed=1)
    down = random_gguf_weight("Q8_0", experts * hidden, inter, seed=2)
    stacked = ExpertWeights(gate_up, down, experts)
    assert stacked.intermediate_size == inter
    x = torch.randn(5, hidden, generator=torch.Generator().manual_seed(0))
    weights, ids = routing(5, experts, 2)
    dense = [w.dequantize().reshape(experts, -1, w.cols) for w in (gate_up, down)]
    expected = per_token(x, *dense, weights, ids)
    out = grouped_experts(x, stacked, weights, ids)
    torch.testing.assert_close(out.double(), expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
    # expert 1's rows are its own: changing expert 0's bytes leaves tokens routed elsewhere alone
    changed = dataclasses.replace(gate_up, data=gate_up.data.clone())
    changed.data[: 2 * inter] = 0
    others = (ids != 0).all(-1)
    out2 = grouped_experts(x, ExpertWeights(changed, down, experts), weights, ids)
    torch.testing.assert_close(out2[others], out[others])
