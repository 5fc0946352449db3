"""The kit's edge inputs: where the classic kernel bugs show and random N(0,1) inputs hide them.

Each check runs a few named input classes per kernel (all-zero rows, tiny and huge scales, an
eps that matters, one token, the last position or slot the shape allows, non-contiguous views,
a softmax scale that is not ``1/sqrt(D)``); a failure names the kernel, the input class and the
error. Tolerances are ``(atol, rtol)`` per dtype, stated beside each check; ``atol`` is
multiplied by the outputs' magnitude where it scales with the inputs.
"""

from __future__ import annotations

from typing import Any

import pytest
from plugins.testing.base import ConformanceBase

# Every check here compares within the kit's per-dtype TOLERANCES (base.py): normalized and
# attention outputs (convex combinations of values ~N(0, 1)) at magnitude 1, element-wise and
# linear outputs with the absolute tolerance scaled by the magnitude the case states (``scale=``).

# (input class, tokens, hidden, input scale, eps, zero rows)
NORM_CASES = [
    ("zero rows, tiny scale 1e-3 with eps 1e-5 (eps matters)", 4, 128, 1e-3, 1e-5, (0, 2)),
    ("huge scale 1e3", 3, 576, 1e3, 1e-6, ()),
    ("one token", 1, 1024, 1.0, 1e-6, ()),
]


class EdgeInputChecks(ConformanceBase):
    """Edge inputs of every kernel, compared with the SDK's reference kernels."""

    @pytest.mark.parametrize("case", NORM_CASES, ids=[c[0] for c in NORM_CASES])
    def test_rms_norm_edges(self, device_plat, ref, gen, dtype_name, case) -> None:
        """``rsqrt(mean(x^2) + eps)``: eps inside the root, float32 sums (the residual
        scales with the input)."""
        what, num_tokens, hidden, scale, eps, zero_rows = case
        dev = device_plat.torch_device()
        x = self._rand((num_tokens, hidden), dtype_name, dev, gen, scale)
        res = self._rand((num_tokens, hidden), dtype_name, dev, gen, scale)
        x[list(zero_rows)], res[list(zero_rows)] = 0, 0
        w = self._rand((hidden,), dtype_name, dev, gen, 0.5)
        kernels = device_plat.kernels
        with self._named(f"rms_norm on {what}", dtype_name):
            got = kernels.rms_norm(x, w, eps)
        self._assert_close(got, ref.rms_norm(x, w, eps), dtype_name, f"rms_norm on {what}")
        with self._named(f"fused_add_rms_norm on {what}", dtype_name):
            out, new_res = kernels.fused_add_rms_norm(x.clone(), res.clone(), w, eps)
        ref_out, ref_res = ref.fused_add_rms_norm(x, res, w, eps)
        self._assert_close(out, ref_out, dtype_name, f"fused_add_rms_norm output on {what}")
        self._assert_close(new_res, ref_res, dtype_name, f"fused_add_rms_norm residual on {what}", scale=scale)

    def test_rms_norm_head_views(self, device_plat, ref, gen, dtype_name) -> None:
        """q/k head norms (Qwen3) normalize ``[T, H, D]`` head views of the fused qkv output."""
        what = "rms_norm on head views of a fused qkv (not contiguous)"
        dev = device_plat.torch_device()
        q = self._heads(5, (4, 2, 2), 64, dtype_name, dev, gen, fused=True)[0]
        w = self._rand((64,), dtype_name, dev, gen, 0.5)
        with self._named(what, dtype_name):
            got = device_plat.kernels.rms_norm(q, w, 1e-6)
        self._assert_close(got, ref.rms_norm(q, w, 1e-6), dtype_name, what)

    @pytest.mark.parametrize("op", ["silu_and_mul", "gelu_tanh_and_mul"])
    @pytest.mark.parametrize(
        "what,num_tokens,inter,scale",
        [("zero rows, huge scale 1e2", 3, 256, 1e2), ("one token, tiny scale 1e-3, a column slice view", 1, 64, 1e-3)],
    )
    def test_gated_activation_edges(self, device_plat, ref, gen, dtype_name, op, what, num_tokens, inter, scale):
        """``act(x[:, :I]) * x[:, I:]``: gate first, up second (outputs ~ scale^2)."""
        dev = device_plat.torch_device()
        wide = self._rand((num_tokens, 2 * inter + 16), dtype_name, dev, gen, scale)
        if num_tokens > 1:
            wide[0] = 0
        x = wide[:, : 2 * inter] if "view" in what else wide[:, : 2 * inter].contiguous()
        with self._named(f"{op} on {what}", dtype_name):
            got = getattr(device_plat.kernels, op)(x)
        expected = getattr(ref, op)(x)
        self._assert_close(got, expected, dtype_name, f"{op} on {what}", scale=scale * scale)

    @pytest.mark.parametrize(
        "what,num_tokens,in_features,out_features,scale",
        [
            ("square weight, zero rows", 5, 64, 64, 1.0),
            ("one token, tiny scale 1e-3, a column slice view", 1, 128, 96, 1e-3),
            ("huge scale 1e3", 3, 64, 32, 1e3),
        ],
    )
    def test_linear_edges(self, device_plat, ref, gen, dtype_name, what, num_tokens, in_features, out_features, scale):
        """``x @ W.T + b`` with ``W [out, in]`` (outputs ~ scale)."""
        dev = device_plat.torch_device()
        wide = self._rand((num_tokens, in_features + 16), dtype_name, dev, gen, scale)
        if num_tokens > 1:
            wide[1] = 0
        x = wide[:, :in_features] if "view" in what else wide[:, :in_features].contiguous()
        w = self._rand((out_features, in_features), dtype_name, dev, gen, in_features**-0.5)
        b = self._rand((out_features,), dtype_name, dev, gen, scale)
        with self._named(f"linear on {what}", dtype_name):
            got = device_plat.kernels.linear(x, device_plat.kernels.prepare_linear(w, None), b)
        expected = ref.linear(x.float(), w.float(), b.float())
        self._assert_close(got, expected, dtype_name, f"linear on {what}", scale=scale)

    @pytest.mark.parametrize("what,positions", [("one token at the last cached position", [-1]),
                                                ("positions 0 and the last, head views of a fused qkv", [0, -1, 3])])  # fmt: skip
    def test_rotary_embedding_edges(self, device_plat, ref, gen, dtype_name, what, positions) -> None:
        """Rotate-half by the cos/sin row of each token's own position (TOLERANCES: |out| ~ |in|)."""
        import torch

        dev, head_size, max_position = device_plat.torch_device(), 64, 96
        inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv)
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dev)
        pos = torch.tensor([p % max_position for p in positions]).to(dev)
        q, k, _ = self._heads(len(positions), (4, 2, 2), head_size, dtype_name, dev, gen, "fused" in what)
        ref_q, ref_k = ref.rotary_embedding(pos, q.clone(), k.clone(), cache)
        with self._named(f"rotary_embedding on {what}", dtype_name):
            got_q, got_k = device_plat.kernels.rotary_embedding(pos, q, k, cache)
        self._assert_close(got_q, ref_q, dtype_name, f"rotary_embedding q on {what}")
        self._assert_close(got_k, ref_k, dtype_name, f"rotary_embedding k on {what}")

    @pytest.mark.parametrize("fused", [False, True], ids=["contiguous", "fused-qkv-views"])
    def test_write_kv_cache_edges(self, device_plat, ref, gen, dtype_name, fused) -> None:
        """The first and the last slot of the cache, and one padding token (exact copies); K and V
        contiguous or head views of a fused qkv projection (as core's attention layer passes them)."""
        import torch

        what = "the first and the last slot of the cache" + (", head views of a fused qkv" if fused else "")
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, [2], [32], 2, 64, 16)
        dev = device_plat.torch_device()
        _, k, v = self._heads(3, (4, 2, 2), 64, dtype_name, dev, gen, fused)
        slots = torch.tensor([0, k_cache.shape[0] * k_cache.shape[1] - 1, -1], dtype=meta.slot_mapping.dtype).to(dev)
        ref_k, ref_v = k_cache.clone(), v_cache.clone()
        ref.write_kv_cache(k.clone(), v.clone(), ref_k, ref_v, slots)
        with self._named(f"write_kv_cache on {what}", dtype_name):
            device_plat.kernels.write_kv_cache(k, v, k_cache, v_cache, slots)
        self._assert_close(k_cache, ref_k, dtype_name, f"write_kv_cache k on {what}", {dtype_name: (0, 0)})
        self._assert_close(v_cache, ref_v, dtype_name, f"write_kv_cache v on {what}", {dtype_name: (0, 0)})

    @pytest.mark.parametrize(
        "what,query_lens,seq_lens,q_scale,scale",
        [
            ("zero query rows, softmax scale 0.3 (not 1/sqrt(D))", [5, 1], [5, 20], 1.0, 0.3),
            ("huge query scale 1e2 (saturated softmax)", [3, 1], [9, 40], 1e2, 0.125),
            ("the longest context the block table holds (full last block)", [4, 1], [64, 64], 1.0, 0.125),
        ],
    )
    def test_paged_attention_edges(
        self, device_plat, ref, gen, dtype_name, what, query_lens, seq_lens, q_scale, scale
    ) -> None:
        """Causal (query at position ``p`` sees keys ``0..p``) at the given scale."""
        meta, k_cache, v_cache = self._kv_case(device_plat, gen, dtype_name, query_lens, seq_lens, 2, 64, 16)
        dev = device_plat.torch_device()
        q = self._rand((meta.num_tokens, 4, 64), dtype_name, dev, gen, q_scale)
        if "zero" in what:
            q[0], q[-1] = 0, 0
        with self._named(f"paged_attention on {what}", dtype_name):
            got = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, scale)
        expected = ref.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, scale)
        self._assert_close(got, expected, dtype_name, f"paged_attention on {what}")

    @pytest.mark.parametrize(
        "what,seq_lens,q_scale,scale",
        [("zero query rows, softmax scale 0.3 (not 1/sqrt(D))", [6, 1, 3], 1.0, 0.3),
         ("huge query scale 1e2 (saturated softmax)", [4, 9], 1e2, 0.125)],
    )  # fmt: skip
    def test_encoder_attention_edges(self, device_plat, gen, dtype_name, what, seq_lens, q_scale, scale) -> None:
        """Bidirectional within each sequence, at the given scale."""
        import torch
        from plugins.testing.pooling_checks import encoder_attention_loop

        dev, num_tokens = device_plat.torch_device(), sum(seq_lens)
        q = self._rand((num_tokens, 4, 32), dtype_name, dev, gen, q_scale)
        k, v = (self._rand((num_tokens, 2, 32), dtype_name, dev, gen) for _ in range(2))
        if "zero" in what:
            q[0], q[-1] = 0, 0
        starts = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        with self._named(f"encoder_attention on {what}", dtype_name):
            got = device_plat.kernels.encoder_attention(q, k, v, starts, list(seq_lens), scale)
        expected = encoder_attention_loop(q.cpu(), k.cpu(), v.cpu(), seq_lens, scale)
        self._assert_close(got, expected, dtype_name, f"encoder_attention on {what}")

    def test_apply_token_bitmask_edges(self, device_plat) -> None:
        """Words with only the sign bit (token 31) or no bit, a last word with one token (exact)."""
        import torch

        what, vocab = "sign-bit-only and empty words, a 33-token vocabulary", 33
        logits = torch.arange(2 * vocab, dtype=torch.float32).view(2, vocab).to(device_plat.torch_device())
        bitmask = torch.tensor([[-(2**31), 1], [0, 0]], dtype=torch.int32)  # row 0 allows tokens 31 and 32
        expected = torch.full((2, vocab), float("-inf"))
        expected[0, 31:] = logits[0, 31:].cpu()
        got = logits.clone()
        with self._named(f"apply_token_bitmask on {what}", "int32"):
            device_plat.kernels.apply_token_bitmask(got, bitmask, [0, 1])
        wrong = (got.cpu() != expected).nonzero().tolist()
        assert not wrong, f"apply_token_bitmask on {what}: {len(wrong)} logits differ, first [row, token]: {wrong[:3]}"

    def _moe_case(self, gen: Any, dtype_name: str, dev: Any, num_tokens: int, top_k: int, scale: float) -> tuple:
        import torch
        from plugins.moe import ExpertWeights

        x = self._rand((num_tokens, 64), dtype_name, dev, gen, scale)
        x[0] = 0
        gate_up = self._rand((4, 64, 64), dtype_name, dev, gen, 64**-0.5)
        down = self._rand((4, 64, 32), dtype_name, dev, gen, 32**-0.5)
        weights, ids = torch.topk(torch.softmax(torch.randn((num_tokens, 4), generator=gen), dim=-1), top_k, dim=-1)
        return x, ExpertWeights(gate_up, down, 4), weights.to(dev), ids.to(dev)

    @pytest.mark.parametrize("what,num_tokens,top_k,scale", [("one token (a zero row), top_k 1", 1, 1, 1.0),
                                                             ("zero row, huge scale 1e2", 3, 2, 1e2)])  # fmt: skip
    def test_fused_moe_edges(self, device_plat, ref, gen, dtype_name, what, num_tokens, top_k, scale) -> None:
        """The routed experts' SiLU MLPs, weighted (outputs ~ scale^2)."""
        x, experts, weights, ids = self._moe_case(gen, dtype_name, device_plat.torch_device(), num_tokens, top_k, scale)
        kernels = device_plat.kernels
        with self._named(f"fused_moe on {what}", dtype_name):
            got = kernels.fused_moe(x, kernels.prepare_experts(experts, None), weights, ids)
        expected = ref.fused_moe(x, ref.prepare_experts(experts, None), weights, ids)
        self._assert_close(got, expected, dtype_name, f"fused_moe on {what}", scale=scale * scale)
