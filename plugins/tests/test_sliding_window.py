"""The reference paged attention's sliding window against dense attention with an explicit mask."""

import torch
import torch.nn.functional as F
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels


def test_window_matches_masked_dense_attention():
    gen = torch.Generator().manual_seed(0)
    block_size, heads, kv_heads, dim, window = 4, 4, 2, 16, 6
    query_lens, seq_lens = [9, 1, 5], [9, 23, 14]  # a prefill, a decode, a chunk of a prefill
    tables = [[7, 2, 9], [0, 1, 3, 4, 5, 6], [8, 10, 11, 12]]
    meta = AttentionMetadata.build(query_lens, seq_lens, tables, block_size)
    k_cache = torch.randn(13, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(13, block_size, kv_heads, dim, generator=gen)
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    got = Kernels().paged_attention(q, k_cache, v_cache, meta, dim**-0.5, sliding_window=window)
    start = 0
    for q_len, s_len, table in zip(query_lens, seq_lens, tables, strict=True):
        keys = k_cache[table].flatten(0, 1)[:s_len].repeat_interleave(2, dim=1).transpose(0, 1)
        values = v_cache[table].flatten(0, 1)[:s_len].repeat_interleave(2, dim=1).transpose(0, 1)
        q_pos = torch.arange(s_len - q_len, s_len)[:, None]
        k_pos = torch.arange(s_len)[None, :]
        visible = (k_pos <= q_pos) & (k_pos > q_pos - window)
        query = q[start : start + q_len].transpose(0, 1)
        expected = F.scaled_dot_product_attention(query, keys, values, attn_mask=visible).transpose(0, 1)
        torch.testing.assert_close(got[start : start + q_len], expected, atol=1e-5, rtol=1e-5)
        start += q_len
    # the window changes the result wherever a query has more than `window` positions behind it
    full = Kernels().paged_attention(q, k_cache, v_cache, meta, dim**-0.5)
    assert not torch.allclose(full, got)
    assert torch.equal(full[:window], got[:window])  # the first prompt's first queries see everything
