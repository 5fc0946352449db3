"""The pooling hook: ``Kernels.encoder_attention`` against a per-sequence float64 loop."""

from __future__ import annotations

from typing import Any

import pytest
from plugins.testing.base import ConformanceBase


def encoder_attention_loop(q: Any, k: Any, v: Any, seq_lens: list[int], scale: float) -> Any:
    """Bidirectional attention one sequence at a time in float64 (the check's yardstick): ``[T, Hq, D]``."""
    import torch

    group = q.shape[1] // k.shape[1]
    out, start = [], 0
    for n in seq_lens:
        query = q[start : start + n].double().transpose(0, 1)  # [Hq, n, D]
        keys = k[start : start + n].double().repeat_interleave(group, dim=1).transpose(0, 1)
        values = v[start : start + n].double().repeat_interleave(group, dim=1).transpose(0, 1)
        probs = torch.softmax(query @ keys.transpose(1, 2) * scale, dim=-1)
        out.append((probs @ values).transpose(0, 1))
        start += n
    return torch.cat(out)


class PoolingChecks(ConformanceBase):
    """Encoders' attention: every query sees its whole sequence and nothing of the others."""

    @pytest.mark.parametrize(
        "seq_lens,q_heads,kv_heads,head_size,fused",
        [
            ([1], 4, 4, 32, False),  # one token
            ([5, 1, 17, 3], 12, 12, 32, False),  # mixed lengths (MiniLM's heads)
            ([40, 7], 8, 2, 64, False),  # GQA
            ([9, 30, 2], 6, 6, 64, True),  # q, k, v views of a fused qkv projection
        ],
    )
    def test_encoder_attention(
        self, device_plat, gen, dtype_name, seq_lens, q_heads, kv_heads, head_size, fused
    ) -> None:
        import torch

        dev = device_plat.torch_device()
        num_tokens = sum(seq_lens)
        q, k, v = self._heads(num_tokens, (q_heads, kv_heads, kv_heads), head_size, dtype_name, dev, gen, fused)
        starts = torch.tensor([0, *torch.tensor(seq_lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        scale = head_size**-0.5
        layout = f"seq_lens {seq_lens}" + (", fused qkv views" if fused else ", contiguous")
        with self._named(f"encoder_attention on {layout}", dtype_name):
            got = device_plat.kernels.encoder_attention(q, k, v, starts, list(seq_lens), scale)
        expected = encoder_attention_loop(q.cpu(), k.cpu(), v.cpu(), seq_lens, scale)
        assert got.shape == q.shape and got.dtype == q.dtype, f"encoder_attention gave {got.dtype} {tuple(got.shape)}"
        self._assert_close(got, expected, dtype_name, f"encoder_attention on {layout}")
