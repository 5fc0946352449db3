"""The MoE hook: ``Kernels.prepare_experts`` + ``Kernels.fused_moe`` against the SDK's grouped default."""

from __future__ import annotations

import pytest
from plugins.testing.base import ConformanceBase


class MoEChecks(ConformanceBase):
    """A batch's expert products (random routing, several experts per token) as the reference computes them."""

    @pytest.mark.parametrize(
        "num_tokens,num_experts,top_k,hidden,inter", [(1, 4, 2, 64, 32), (7, 8, 2, 128, 64), (33, 8, 3, 64, 96)]
    )
    def test_fused_moe(self, device_plat, ref, gen, dtype_name, num_tokens, num_experts, top_k, hidden, inter) -> None:
        import torch
        from plugins.moe import ExpertWeights

        dev = device_plat.torch_device()
        x = self._rand((num_tokens, hidden), dtype_name, dev, gen)
        gate_up = self._rand((num_experts, 2 * inter, hidden), dtype_name, dev, gen, hidden**-0.5)
        down = self._rand((num_experts, hidden, inter), dtype_name, dev, gen, inter**-0.5)
        logits = torch.randn((num_tokens, num_experts), generator=gen)
        weights, ids = torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)
        weights, ids = weights.to(dev), ids.to(dev)
        kernels = device_plat.kernels
        what = f"fused_moe on {num_tokens} random tokens, top {top_k} of {num_experts} experts"
        with self._named(what, dtype_name):
            experts = kernels.prepare_experts(ExpertWeights(gate_up, down, num_experts), None)
            got = kernels.fused_moe(x, experts, weights, ids)
        expected = ref.fused_moe(x, ref.prepare_experts(ExpertWeights(gate_up, down, num_experts), None), weights, ids)
        assert got.shape == x.shape and got.dtype == x.dtype, f"fused_moe gave {got.dtype} {tuple(got.shape)}"
        self._assert_close(got, expected, dtype_name, what)
