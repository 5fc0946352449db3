"""KV caches of another dtype than the compute one in the native kernels (one-byte caches,
bfloat16 and float16 caches under float32): bytes equal to torch's casts, and attention over
them equal to the torch reference reading the same bytes."""

from __future__ import annotations

import pytest
import torch
from plugins.attention import AttentionMetadata
from plugins.kv_cache import new_kv_scale

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
BLOCK = 16


def _slots_case(gen, num_blocks=12, block_size=16):
    """Two prefills and a decode token scattered over shuffled blocks, one padding token."""
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    meta = AttentionMetadata.build([9, 1, 20], [9, 30, 20], [ids[:1], ids[1:3], ids[3:5]], block_size)
    meta.slot_mapping[4] = -1
    return meta


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_stores_torch_float8_bytes(kernels, ref, gen, cache_dtype, dtype):
    """Every value class: normal, subnormal, zero, beyond the range (saturated), ties."""
    meta = _slots_case(gen)
    k = (torch.randn(meta.num_tokens, 2, 64, generator=gen) * 3).to(dtype)
    v = (torch.randn(meta.num_tokens, 2, 64, generator=gen) * 0.004).to(dtype)  # around E4M3's subnormals
    k[0, 0, :4] = torch.tensor([1e6, -1e6, 0.0, -0.0]).to(dtype)
    k[1, 0, :8] = torch.tensor([1.0625, 1.1875, 0.0048828125, 240.0, 232.0, 448.0, 464.0, 57344.0]).to(dtype)  # ties
    shape = (12, 16, 2, 64)
    got_k, got_v, want_k, want_v = (torch.zeros(shape, dtype=cache_dtype) for _ in range(4))
    scaled = cache_dtype == torch.float8_e4m3fn
    got_s, want_s = (new_kv_scale("cpu") if scaled else None for _ in range(2))
    kernels.write_kv_cache(k, v, got_k, got_v, meta.slot_mapping, **({"kv_scale": got_s} if scaled else {}))
    ref.write_kv_cache(k, v, want_k, want_v, meta.slot_mapping, **({"kv_scale": want_s} if scaled else {}))
    if scaled:
        assert torch.equal(got_s, want_s) and bool((got_s > 0).all())
    assert torch.equal(got_k.view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(got_v.view(torch.uint8), want_v.view(torch.uint8))


def test_e4m3_unscaled_matches_torch_on_every_byte(kernels, ref):
    """All 256 E4M3 values, and the midpoints between neighbours (ties to even), as inputs."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    values = values[~values.isnan()].sort().values
    inputs = torch.cat([values, (values[1:] + values[:-1]) / 2])
    rows = inputs.numel() // 64 + 1
    x = torch.zeros(rows * 64)
    x[: inputs.numel()] = inputs
    x = x.view(rows, 1, 64)
    slots = torch.arange(rows, dtype=torch.int64)
    got, want = (torch.zeros(rows, 1, 1, 64, dtype=torch.float8_e4m3fn) for _ in range(2))
    scale = torch.ones(2)
    kernels.write_kv_cache(x, x, got, got.clone(), slots, kv_scale=scale)
    ref.write_kv_cache(x, x, want, want.clone(), slots, kv_scale=scale)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def _attention_case(gen, query_lens, seq_lens):
    """Sequences' blocks taken from 8 shuffled ones of :data:`BLOCK` slots."""
    ids = torch.randperm(8, generator=gen).tolist()
    tables, at = [], 0
    for s in seq_lens:
        n = -(-s // BLOCK)
        tables.append(ids[at : at + n])
        at += n
    return AttentionMetadata.build(query_lens, seq_lens, tables, BLOCK)


@pytest.mark.parametrize("cache_dtype", FP8)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "query_lens,seq_lens,hq,hk,d", [([1, 1], [17, 40], 9, 3, 64), ([5, 1, 12], [5, 33, 20], 8, 2, 40)]
)
def test_attention_reads_fp8_cache(kernels, ref, gen, close, cache_dtype, dtype, query_lens, seq_lens, hq, hk, d):
    meta = _attention_case(gen, query_lens, seq_lens)
    raw = torch.randint(0, 256, (2, 8, BLOCK, hk, d), generator=gen, dtype=torch.uint8).view(cache_dtype).float()
    # random bytes of every class but NaN (never stored), within +-8: exp() of the scores stays informative
    raw = raw.nan_to_num(0.0).clamp(-8, 8).to(cache_dtype)
    k_cache, v_cache = raw[0].contiguous(), raw[1].contiguous()
    q = torch.randn(sum(query_lens), hq, d, generator=gen).to(dtype)
    kw = {"kv_scale": torch.tensor([0.3, 0.05])} if cache_dtype == torch.float8_e4m3fn else {}
    got = kernels.paged_attention(q, k_cache, v_cache, meta, d**-0.5, **kw)
    close(got, ref.paged_attention(q, k_cache, v_cache, meta, d**-0.5, **kw), f"paged_attention over {cache_dtype}")


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
def test_16bit_cache_under_float32_stores_torch_bytes(kernels, ref, gen, cache_dtype):
    """Rounded to nearest even as torch casts: ties both ways, overflow to inf, infinities,
    the largest finite values and subnormals (of both formats); NaN stays NaN (torch's NaN
    bits vary by path)."""
    meta = _slots_case(gen)
    k = torch.randn(meta.num_tokens, 2, 64, generator=gen) * 3
    v = torch.randn(meta.num_tokens, 2, 64, generator=gen) * (1e-39 if cache_dtype == torch.bfloat16 else 1e-6)
    info = torch.finfo(cache_dtype)
    ulp = info.eps / 2  # half a step at 1.0: a tie
    special = [1.0 + ulp, 1.0 + 3 * ulp, -(1.0 + ulp), float(info.max), float(info.max) * (1 + ulp / 2),
               float(info.max) * (1 + ulp), float("inf"), -float("inf"), float("nan"), float(info.smallest_normal),
               float(info.smallest_normal) * 0.75, float(info.tiny) * 2**-3]  # fmt: skip
    k[0, 0, : len(special)] = torch.tensor(special)
    shape = (12, 16, 2, 64)
    got_k, got_v, want_k, want_v = (torch.zeros(shape, dtype=cache_dtype) for _ in range(4))
    kernels.write_kv_cache(k, v, got_k, got_v, meta.slot_mapping)
    ref.write_kv_cache(k, v, want_k, want_v, meta.slot_mapping)
    nan = want_k.isnan()
    assert int(nan.sum()) == 1 and bool(got_k[nan].isnan().all())
    got_k[nan] = want_k[nan] = 0
    assert torch.equal(got_k.view(torch.int16), want_k.view(torch.int16))
    assert torch.equal(got_v.view(torch.int16), want_v.view(torch.int16))


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "query_lens,seq_lens,hq,hk,d", [([1, 1], [17, 40], 9, 3, 64), ([5, 1, 12], [5, 33, 20], 8, 2, 40)]
)
@pytest.mark.parametrize("window", [None, 7])
def test_attention_reads_16bit_cache_under_float32(
    kernels, ref, gen, close, cache_dtype, query_lens, seq_lens, hq, hk, d, window
):
    meta = _attention_case(gen, query_lens, seq_lens)
    k_cache, v_cache = (torch.randn(8, BLOCK, hk, d, generator=gen).to(cache_dtype) for _ in range(2))
    q = torch.randn(sum(query_lens), hq, d, generator=gen)
    got = kernels.paged_attention(q, k_cache, v_cache, meta, d**-0.5, window)
    assert got.dtype == torch.float32
    want = ref.paged_attention(q, k_cache, v_cache, meta, d**-0.5, window)
    close(got, want, f"paged_attention over a {cache_dtype} cache (float32 queries)")


def test_16bit_cache_under_bfloat16_falls_back_to_the_reference(kernels, ref, gen):
    """A float16 cache under bfloat16 compute: no native kernel reads it, the reference does."""
    meta = _attention_case(gen, [3, 1], [3, 20])
    k_cache, v_cache = (torch.randn(8, BLOCK, 2, 64, generator=gen).half() for _ in range(2))
    q = torch.randn(4, 4, 64, generator=gen).bfloat16()
    got = kernels.paged_attention(q, k_cache, v_cache, meta, 0.125)
    assert torch.equal(got, ref.paged_attention(q, k_cache, v_cache, meta, 0.125))
