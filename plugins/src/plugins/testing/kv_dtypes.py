"""The kit's checks of KV caches of each dtype a platform declares.

For each dtype a platform declares in :attr:`plugins.Platform.supported_kv_cache_dtypes`
(the 16-bit and one-byte ones): its ``write_kv_cache`` stores what the SDK's reference stores
(and sets the same E4M3 scales), and its ``paged_attention`` over those bytes equals the
reference attention over the same values read as float32.
"""

from __future__ import annotations

from typing import Any

import pytest
from plugins.testing.base import ConformanceBase


class KvCacheDtypeChecks(ConformanceBase):
    """``kv_cache_dtype`` is parametrized over the platform's declared dtypes (None: the check is skipped)."""

    def test_declared_kv_cache_dtypes_are_known(self, plat) -> None:
        from plugins.kv_cache import DECLARABLE_KV_DTYPES

        unknown = set(plat.supported_kv_cache_dtypes) - set(DECLARABLE_KV_DTYPES)
        assert not unknown, (
            f"{plat.name} declares unknown KV cache dtypes {sorted(unknown)}; known: {sorted(DECLARABLE_KV_DTYPES)}"
        )

    @pytest.mark.parametrize("fused", [False, True])
    def test_kv_cache_dtype_write_and_attention(self, device_plat, ref, gen, dtype_name, kv_cache_dtype, fused) -> None:
        import torch
        from plugins.attention import AttentionMetadata
        from plugins.kv_cache import DECLARABLE_KV_DTYPES, dequantize, needs_scale, new_kv_scale

        if kv_cache_dtype is None:
            pytest.skip(f"{device_plat.name} declares no KV cache dtype besides the compute dtype")
        cache_dtype, dev = DECLARABLE_KV_DTYPES[kv_cache_dtype], device_plat.torch_device()
        query_lens, seq_lens, block_size, head_size = [7, 1, 30, 1], [7, 100, 45, 33], 16, 64
        meta, _, _ = self._kv_case(device_plat, gen, dtype_name, query_lens, seq_lens, 2, head_size, block_size)
        tables = [row[: -(-s // block_size)] for row, s in zip(meta.block_tables.tolist(), seq_lens, strict=True)]
        full = AttentionMetadata.build(seq_lens, seq_lens, tables, block_size, device=dev)  # every position written
        q, k, v = self._heads(full.num_tokens, (6, 2, 2), head_size, dtype_name, dev, gen, fused)
        k, v = k * 4, v * 0.05  # keys larger than values, as in models: distinct K and V scales
        num_blocks = int(meta.block_tables.max()) + 1
        shape = (num_blocks, block_size, 2, head_size)
        k_cache, v_cache = (torch.zeros(shape, dtype=cache_dtype, device=dev) for _ in range(2))
        scaled = needs_scale(cache_dtype)
        kv_scale = new_kv_scale(dev) if scaled else None
        device_plat.kernels.write_kv_cache(k, v, k_cache, v_cache, full.slot_mapping, **_scale_arg(kv_scale))
        # the reference, on the host, from the same inputs
        k_ref, v_ref = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
        s_ref = new_kv_scale("cpu") if scaled else None
        ref.write_kv_cache(k.cpu(), v.cpu(), k_ref, v_ref, full.slot_mapping.cpu(), **_scale_arg(s_ref))
        k_got, v_got = k_cache.cpu(), v_cache.cpu()
        k_scale, v_scale = (None, None) if kv_scale is None else kv_scale.cpu()
        what = f"{kv_cache_dtype} cache ({dtype_name}, {'fused qkv views' if fused else 'contiguous'})"
        if scaled:
            torch.testing.assert_close(kv_scale.cpu(), s_ref, rtol=1e-6, atol=0, msg=lambda m: f"{what} kv_scale: {m}")
        # at most one step of the format apart (the native rounding of a 16-bit input may tie otherwise)
        info = torch.finfo(cache_dtype)
        step = info.eps  # 2^-mantissa bits
        for name, got, want, scale in (("k", k_got, k_ref, k_scale), ("v", v_got, v_ref, v_scale)):
            atol = info.smallest_normal * step * (1.0 if scale is None else float(scale))  # a subnormal step
            torch.testing.assert_close(
                dequantize(got, scale),
                dequantize(want, scale),
                rtol=step,
                atol=atol,
                msg=lambda m, name=name: f"{what} {name}: {m}",
            )
        # this step's queries: the last query_len positions of each sequence
        rows = [
            torch.arange(s - n, s) + int(full.query_start_loc[i])
            for i, (n, s) in enumerate(zip(query_lens, seq_lens, strict=True))
        ]
        q = q[torch.cat(rows).to(dev)]
        out = device_plat.kernels.paged_attention(q, k_cache, v_cache, meta, head_size**-0.5, **_scale_arg(kv_scale))
        keys, values = dequantize(k_got, k_scale), dequantize(v_got, v_scale)
        expected = ref.paged_attention(q.cpu().float(), keys, values, _on_cpu(meta), head_size**-0.5)
        self._assert_close(out, expected, dtype_name, f"paged_attention over a {what}")


def _scale_arg(kv_scale: Any) -> dict[str, Any]:
    """The ``kv_scale`` keyword only where there is a scale, as core's layers pass it."""
    return {} if kv_scale is None else {"kv_scale": kv_scale}


def _on_cpu(meta: Any) -> Any:
    from dataclasses import replace

    return replace(
        meta, query_start_loc=meta.query_start_loc.cpu(), seq_lens=meta.seq_lens.cpu(),
        block_tables=meta.block_tables.cpu(), slot_mapping=meta.slot_mapping.cpu(),
    )  # fmt: skip
