"""Triton kernels against the torch reference (plugins.kernels.Kernels).

Off-GPU these run under Triton's interpreter at small shapes in fp32 and fp16 (bf16
arithmetic is wrong in the interpreter); on a GPU the same tests run natively, plus
bf16 and larger shapes (marked ``gpu``).
"""

from __future__ import annotations

import pytest
import torch
from plugins.attention import AttentionMetadata
from plugins.gpu_triton.kernels import TritonKernels, attention_tiles
from plugins.kernels import Kernels

HAS_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_GPU else "cpu")
TOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]

REF = Kernels()


@pytest.fixture(scope="module")
def kernels() -> TritonKernels:
    # small splits so that split-K decode is exercised at test sizes
    return TritonKernels(decode_split_tokens=16, num_sms=4)


def rand(*shape: int, dtype=torch.float32, gen=None, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 16), (5, 40), (3, 300)])
def test_rms_norm_and_fused_add(kernels, dtype, rows, hidden) -> None:
    gen = torch.Generator().manual_seed(rows * hidden)
    x, res, w = (
        rand(rows, hidden, dtype=dtype, gen=gen),
        rand(rows, hidden, dtype=dtype, gen=gen),
        rand(hidden, dtype=dtype, gen=gen),
    )
    close(kernels.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6), dtype)
    out, summed = kernels.fused_add_rms_norm(x, res, w, 1e-5)
    want_out, want_sum = REF.fused_add_rms_norm(x, res, w, 1e-5)
    close(summed, want_sum, dtype)
    close(out, want_out, dtype)


def test_rms_norm_strided_rows_and_3d(kernels) -> None:
    gen = torch.Generator().manual_seed(1)
    base = rand(4, 64, gen=gen)
    x = base[:, :32]  # rows 64 apart
    w = rand(32, gen=gen)
    close(kernels.rms_norm(x, w, 1e-6), REF.rms_norm(x, w, 1e-6), torch.float32)
    x3 = rand(2, 3, 32, gen=gen)
    close(kernels.rms_norm(x3, w, 1e-6), REF.rms_norm(x3, w, 1e-6), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 8), (4, 100)])
def test_silu_and_mul(kernels, dtype, rows, inter) -> None:
    x = rand(rows, 2 * inter, dtype=dtype, gen=torch.Generator().manual_seed(inter))
    close(kernels.silu_and_mul(x), REF.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,q_heads,kv_heads,head_size", [(1, 2, 2, 16), (5, 6, 2, 24)])
def test_rotary_embedding(kernels, dtype, tokens, q_heads, kv_heads, head_size) -> None:
    gen = torch.Generator().manual_seed(tokens)
    inv = 1.0 / (10000 ** (torch.arange(0, head_size, 2, dtype=torch.float32) / head_size))
    cache = torch.cat([torch.outer(torch.arange(64.0), inv).cos(), torch.outer(torch.arange(64.0), inv).sin()], -1)
    cache = cache.to(DEVICE)
    positions = torch.randint(0, 64, (tokens,), generator=gen).to(DEVICE)
    qkv = rand(tokens, (q_heads + kv_heads) * head_size, dtype=dtype, gen=gen)
    q = qkv[:, : q_heads * head_size].view(tokens, q_heads, head_size)  # strided, as models pass them
    k = qkv[:, q_heads * head_size :].view(tokens, kv_heads, head_size)
    q_before = q.clone()
    got_q, got_k = kernels.rotary_embedding(positions, q, k, cache)
    want_q, want_k = REF.rotary_embedding(positions, q, k, cache)
    close(got_q, want_q, dtype)
    close(got_k, want_k, dtype)
    assert torch.equal(q, q_before), "inputs must not be modified (the reference returns new tensors)"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,head_size", [(4, 16), (16, 24)])
def test_write_kv_cache_skips_negative_slots(kernels, dtype, block_size, head_size) -> None:
    gen = torch.Generator().manual_seed(block_size)
    num_blocks, tokens, heads = 6, 9, 2
    kv = rand(tokens, 2 * heads * head_size, dtype=dtype, gen=gen)
    k = kv[:, : heads * head_size].view(tokens, heads, head_size)
    v = kv[:, heads * head_size :].view(tokens, heads, head_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    slots[3] = -1
    slots = slots.to(DEVICE)
    caches = [rand(num_blocks, block_size, heads, head_size, dtype=dtype, gen=gen) for _ in range(2)]
    want = [c.clone() for c in caches]
    kernels.write_kv_cache(k, v, caches[0], caches[1], slots)
    REF.write_kv_cache(k, v, want[0], want[1], slots)
    assert torch.equal(caches[0], want[0]) and torch.equal(caches[1], want[1])


def make_batch(query_lens, seq_lens, kv_heads, head_size, block_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(needed) + 2
    perm = torch.randperm(num_blocks, generator=gen).tolist()  # scattered blocks
    tables, start = [], 0
    for n in needed:
        tables.append(perm[start : start + n])
        start += n
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size, device=DEVICE)
    k_cache = rand(num_blocks, block_size, kv_heads, head_size, dtype=dtype, gen=gen)
    v_cache = rand(num_blocks, block_size, kv_heads, head_size, dtype=dtype, gen=gen)
    return meta, k_cache, v_cache, gen


ATTENTION_CASES = [
    # query_lens, seq_lens, q_heads, kv_heads, head_size, block_size
    ([1], [1], 2, 2, 16, 4),  # first decode token
    ([1, 1, 1], [5, 40, 17], 4, 2, 16, 4),  # decode, GQA, split-K (40 tokens > 16 per split)
    ([1, 1], [33, 9], 6, 2, 24, 16),  # decode, head size not a power of two
    ([7], [7], 4, 4, 16, 8),  # prefill from scratch
    ([3, 1, 20, 1], [5, 20, 30, 33], 4, 1, 16, 4),  # mixed: chunked prefill + decode, MQA
    ([5, 2], [5, 14], 2, 2, 16, 12),  # block size not a power of two
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("query_lens,seq_lens,q_heads,kv_heads,head_size,block_size", ATTENTION_CASES)
def test_paged_attention(kernels, dtype, query_lens, seq_lens, q_heads, kv_heads, head_size, block_size) -> None:
    meta, k_cache, v_cache, gen = make_batch(
        query_lens, seq_lens, kv_heads, head_size, block_size, dtype, len(seq_lens)
    )
    q = rand(meta.num_tokens, q_heads, head_size, dtype=dtype, gen=gen)
    got = kernels.paged_attention(q, k_cache, v_cache, meta, head_size**-0.5)
    want = REF.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, head_size**-0.5)
    close(got, want, dtype)


def test_decode_padding_sequence_gives_zeros(kernels) -> None:
    """A runner's padding sequence (seq_len 0, as pad_inputs makes it) attends to nothing."""
    from plugins.runner import ModelInputs, pad_inputs

    meta, k_cache, v_cache, gen = make_batch([1, 1], [40, 3], 2, 16, 4, torch.float32, 7)
    q = rand(4, 4, 16, gen=gen)
    ids = torch.zeros(2, dtype=torch.int64, device=DEVICE)
    padded = pad_inputs(ModelInputs(ids, ids, meta), 4).attn_metadata
    got = kernels.paged_attention(q, k_cache, v_cache, padded, 0.25)
    close(got, REF.paged_attention(q, k_cache, v_cache, padded, 0.25), torch.float32)
    assert torch.count_nonzero(got[2:]) == 0


def test_decode_grid_from_host_max_reads_true_lengths_on_device(kernels) -> None:
    """What a CUDA graph relies on: host lengths only size the grid (here: far too long),
    the kernel reads each sequence's real length from ``seq_lens``."""
    meta, k_cache, v_cache, gen = make_batch([1, 1, 1], [5, 40, 17], 2, 16, 4, torch.float32, 3)
    q = rand(3, 4, 16, gen=gen)
    want = REF.paged_attention(q, k_cache, v_cache, meta, 0.25)
    meta.seq_lens_host = [96, 96, 96]
    close(kernels.paged_attention(q, k_cache, v_cache, meta, 0.25), want, torch.float32)


def test_reference_backends_are_the_reference() -> None:
    ref_kernels = TritonKernels(attention_backend="reference", ops_backend="reference")
    assert not ref_kernels.is_graph_safe
    assert TritonKernels().is_graph_safe
    with pytest.raises(ValueError, match="attention_backend must be one of triton, reference"):
        TritonKernels(attention_backend="flash")


def test_attention_tiles_fit_small_shared_memory() -> None:
    assert attention_tiles(torch.bfloat16, 128) == (64, 64)
    assert attention_tiles(torch.float32, 128) == (32, 32)
    assert attention_tiles(torch.float32, 256) == (16, 16)
    assert attention_tiles(torch.float16, 80) == (64, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_paged_attention_gpu_sizes(dtype) -> None:
    """Realistic sizes on the GPU with the default tiles and split planning."""
    kernels = TritonKernels()
    query_lens = [1] * 6 + [300, 77]
    seq_lens = [1, 17, 1000, 4000, 129, 64, 300, 1500]
    meta, k_cache, v_cache, gen = make_batch(query_lens, seq_lens, 8, 128, 16, dtype, 11)
    q = rand(meta.num_tokens, 32, 128, dtype=dtype, gen=gen)
    want = REF.paged_attention(q.float(), k_cache.float(), v_cache.float(), meta, 128**-0.5)
    close(kernels.paged_attention(q, k_cache, v_cache, meta, 128**-0.5), want, dtype)
    decode = AttentionMetadata.build(query_lens[:6], seq_lens[:6], meta.block_tables[:6].tolist(), 16, device=DEVICE)
    q = rand(6, 32, 128, dtype=dtype, gen=gen)
    want = REF.paged_attention(q.float(), k_cache.float(), v_cache.float(), decode, 128**-0.5)
    close(kernels.paged_attention(q, k_cache, v_cache, decode, 128**-0.5), want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
@pytest.mark.parametrize("n,k,bias", [(24, 40, False), (37, 300, True), (9, 1000, True)])
def test_skinny_linear(dtype, rows, n, k, bias) -> None:
    """Every tile of the chooser's list against F.linear: partial row/column/K blocks, a
    bias, a strided ``x`` (a view of wider rows), rows padded to the next power of two."""
    from plugins.gpu_triton.gemv import CONFIGS, DEFAULT_CONFIG, MAX_TILE, skinny_linear

    gen = torch.Generator().manual_seed(rows * n + k)
    x = rand(rows, k + 8, dtype=dtype, gen=gen)[:, 3 : 3 + k]
    w = rand(n, k, dtype=dtype, gen=gen, scale=k**-0.5)
    b = rand(n, dtype=dtype, gen=gen) if bias else None
    want = torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
    pad = 1 << (rows - 1).bit_length()
    for config in {DEFAULT_CONFIG, *(c for c in CONFIGS if pad * c[0] * c[1] <= MAX_TILE)}:
        close(skinny_linear(x, w, b, config), want, dtype)


def test_skinny_linear_routing() -> None:
    """``linear`` takes the skinny kernel for up to 4 rows when asked (``skinny_gemm="triton"``),
    cuBLAS (the reference) beyond that, by default (``"cublas"``) or with None; ``auto`` never
    times off-GPU nor a weight under ``MIN_TIMED_BYTES``; a bad mode is refused."""
    from plugins.gpu_triton import gemv

    gen = torch.Generator().manual_seed(3)
    w, b = rand(16, 32, gen=gen), rand(16, gen=gen)
    forced = TritonKernels(skinny_gemm="triton")
    calls = []
    real = gemv.skinny_linear
    try:
        gemv.skinny_linear = lambda *a: calls.append(a[0].shape[0]) or real(*a)
        for rows in (1, 4, 5):
            x = rand(rows, 32, gen=gen)
            close(forced.linear(x, w, b), REF.linear(x, w, b), torch.float32)
        assert calls == [1, 4]
        for kernels in (TritonKernels(), TritonKernels(skinny_gemm=None), TritonKernels(skinny_gemm="auto")):
            close(kernels.linear(x[:2], w, b), REF.linear(x[:2], w, b), torch.float32)
        assert calls == [1, 4] and kernels._skinny is not None and not kernels._skinny.choices
    finally:
        gemv.skinny_linear = real
    with pytest.raises(ValueError, match="skinny_gemm must be one of auto, triton, cublas"):
        TritonKernels(skinny_gemm="cutlass")


@pytest.mark.gpu
def test_skinny_chooser_times_on_gpu() -> None:
    """On a GPU, ``auto`` times a decode shape once and keeps a choice whose answer is right."""
    kernels = TritonKernels(skinny_gemm="auto")
    gen = torch.Generator().manual_seed(4)
    x, w = rand(1, 896, dtype=torch.bfloat16, gen=gen), rand(1152, 896, dtype=torch.bfloat16, gen=gen, scale=0.03)
    close(kernels.linear(x, w), REF.linear(x, w), torch.bfloat16)
    (choice,) = kernels._skinny.choices.values()
    assert choice.cublas_us > 0 and choice.skinny_us > 0
