"""Paged attention vs the torch reference on mixed prefill + decode batches."""

from __future__ import annotations

import pytest
import torch
from plugins.attention import AttentionMetadata

DTYPES = (torch.float32, torch.bfloat16)
CASES = [
    # query_lens, seq_lens, q heads, kv heads, head size
    ([1], [1], 9, 3, 64),  # first decode token
    ([1, 1, 1], [17, 40, 5], 9, 3, 64),  # decode batch, GQA 3
    ([7], [7], 4, 4, 128),  # plain prefill, MHA
    ([5, 1, 12, 1], [5, 33, 20, 70], 8, 2, 64),  # mixed: prefill, decode, chunked prefill
    ([3, 1], [100, 1], 16, 1, 128),  # MQA, long context chunk
    ([2, 1], [37, 70], 6, 2, 40),  # head size 40: 8-wide score loop, generic P.V loop
    ([1, 4], [45, 9], 4, 2, 20),  # head size 20: the generic loops only
    # prefill tokens in tiles (up to 4 tokens, at most 16 heads, sharing each K/V row): tiles
    # across 32-key chunks, a part tile; group 4 (tiles of 16 heads), group 7 (tiles of 2 tokens)
    ([37, 1], [37, 50], 9, 3, 64),
    ([70], [90], 8, 2, 64),
    ([9, 2], [9, 41], 14, 2, 64),
    # AMX builds take prompts of 16 or more tokens on the tile unit: two in one batch (one a chunk
    # onto 67 cached keys) beside a decode token and a short prompt; 16 tokens onto 284 keys, MQA
    ([20, 1, 33, 3], [20, 60, 100, 8], 9, 3, 64),
    ([16], [300], 16, 1, 128),
]


def make_case(gen, rand, dtype, query_lens, seq_lens, hq, hk, d, block_size):
    """Random caches, a shuffled block allocation and the metadata that indexes it."""
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    tables, at = [], 0
    for n in blocks_per_seq:
        tables.append(ids[at : at + n])
        at += n
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    k_cache = rand((num_blocks, block_size, hk, d), dtype, gen)
    v_cache = rand((num_blocks, block_size, hk, d), dtype, gen)
    q = rand((sum(query_lens), hq, d), dtype, gen)
    return q, k_cache, v_cache, meta


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("query_lens,seq_lens,hq,hk,d", CASES)
def test_paged_attention(kernels, ref, gen, rand, close, dtype, block_size, query_lens, seq_lens, hq, hk, d):
    q, k_cache, v_cache, meta = make_case(gen, rand, dtype, query_lens, seq_lens, hq, hk, d, block_size)
    scale = d**-0.5
    close(
        kernels.paged_attention(q, k_cache, v_cache, meta, scale),
        ref.paged_attention(q, k_cache, v_cache, meta, scale),
        "paged_attention",
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [1, 24, 64])
def test_paged_attention_sliding_window(kernels, ref, gen, rand, close, dtype, window):
    """A sliding-window layer's prompts (AMX builds: on the tile unit, each token's first key a
    lane mask) and a decode token: each query sees only its last ``window`` keys."""
    q, k_cache, v_cache, meta = make_case(gen, rand, dtype, [40, 1, 20], [40, 90, 70], 8, 2, 64, 16)
    close(
        kernels.paged_attention(q, k_cache, v_cache, meta, 0.125, sliding_window=window),
        ref.paged_attention(q, k_cache, v_cache, meta, 0.125, sliding_window=window),
        f"paged_attention window {window}",
    )


def test_paged_attention_strided_q_and_padding(kernels, ref, gen, rand, close):
    """q as a view of a fused qkv tensor, and a runner's padding sequence (seq_len 0)."""
    hq, hk, d, bs = 6, 2, 64, 16
    _, k_cache, v_cache, meta = make_case(gen, rand, torch.float32, [1, 1], [9, 30], hq, hk, d, bs)
    meta.seq_lens[1] = 0  # as plugins.runner.pad_inputs builds it
    meta.seq_lens_host[1] = 0
    qkv = rand((2, (hq + 2 * hk) * d), torch.float32, gen)
    q = qkv[:, : hq * d].view(2, hq, d)
    out = kernels.paged_attention(q, k_cache, v_cache, meta, 0.125)
    close(out, ref.paged_attention(q, k_cache, v_cache, meta, 0.125), "strided q")
    assert torch.all(out[1] == 0)


def test_unsupported_layout_falls_back(kernels, ref, gen, rand, close):
    """float16 is not a native dtype: the reference runs instead, same result."""
    q, k_cache, v_cache, meta = make_case(gen, rand, torch.float16, [2], [5], 4, 2, 64, 16)
    out = kernels.paged_attention(q, k_cache, v_cache, meta, 0.125)
    assert torch.equal(out, ref.paged_attention(q, k_cache, v_cache, meta, 0.125))
