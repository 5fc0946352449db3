"""Row-wise kernels vs the torch reference, on every ISA path, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

DTYPES = (torch.float32, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 576), (7, 64), (33, 1000), (64, 2048)])
def test_rms_norm(kernels, ref, gen, rand, close, dtype, tokens, hidden):
    x, w = rand((tokens, hidden), dtype, gen, 3.0), rand((hidden,), dtype, gen)
    close(kernels.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), "rms_norm")
    w32 = w.float()  # float32 weight with a bf16 activation
    close(kernels.rms_norm(x, w32, 1e-5), ref.rms_norm(x, w32, 1e-5), "rms_norm fp32 weight")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hidden", [(1, 576), (5, 96), (40, 1024)])
def test_fused_add_rms_norm(kernels, ref, gen, rand, close, dtype, tokens, hidden):
    x, res, w = rand((tokens, hidden), dtype, gen), rand((tokens, hidden), dtype, gen, 2.0), rand((hidden,), dtype, gen)
    out, summed = kernels.fused_add_rms_norm(x, res, w, 1e-6)
    ref_out, ref_summed = ref.fused_add_rms_norm(x, res, w, 1e-6)
    assert torch.equal(summed, ref_summed), "the new residual is x + residual rounded once"
    close(out, ref_out, "fused_add_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hq,hk,d", [(1, 9, 3, 64), (13, 8, 8, 128), (40, 4, 1, 64)])
def test_rotary_embedding(kernels, ref, gen, rand, close, dtype, tokens, hq, hk, d):
    qkv = rand((tokens, (hq + 2 * hk) * d), dtype, gen)
    q = qkv[:, : hq * d].view(tokens, hq, d)  # strided views as the model passes them
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    positions = torch.randint(0, 500, (tokens,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(512).float(), inv)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    for c in (cache, cache.to(dtype)):
        q_out, k_out = kernels.rotary_embedding(positions, q, k, c)
        q_ref, k_ref = ref.rotary_embedding(positions, q, k, c)
        close(q_out, q_ref, f"rotary q (cache {c.dtype})")
        close(k_out, k_ref, f"rotary k (cache {c.dtype})")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [(1, 1536), (9, 100), (64, 512)])
def test_silu_and_mul(kernels, ref, gen, rand, close, dtype, tokens, inter):
    x = rand((tokens, 2 * inter), dtype, gen, 4.0)
    close(kernels.silu_and_mul(x), ref.silu_and_mul(x), "silu_and_mul")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
def test_write_kv_cache(kernels, ref, gen, rand, close, dtype, block_size):
    tokens, hk, d, blocks = 11, 3, 64, 6
    kv = rand((tokens, 2 * hk * d), dtype, gen)
    k, v = kv[:, : hk * d].view(tokens, hk, d), kv[:, hk * d :].view(tokens, hk, d)
    slots = torch.randperm(blocks * block_size, generator=gen)[:tokens]
    slots[3] = -1  # padding token: not written
    caches = [rand((blocks, block_size, hk, d), dtype, gen) for _ in range(2)]
    expected = [c.clone() for c in caches]
    kernels.write_kv_cache(k, v, caches[0], caches[1], slots)
    ref.write_kv_cache(k, v, expected[0], expected[1], slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])
    slots[0] = blocks * block_size
    with pytest.raises(IndexError, match="slot"):
        kernels.write_kv_cache(k, v, caches[0], caches[1], slots)
