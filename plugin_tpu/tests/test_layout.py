"""The host-side padding and per-token layout of the XLA path, and its attention in plain
torch on the CPU (no torch_xla needed; test_xla.py runs the same on the XLA device)."""

import torch
from plugin_tpu.kernels import XlaKernels, token_layout
from plugin_tpu.runner import pad_to_host
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.runner import ModelInputs


def _mixed_batch():
    # a prefill of 3, a decode at position 17, a chunk of 2 at positions 4-5; blocks of 4
    meta = AttentionMetadata.build([3, 1, 2], [3, 18, 6], [[7], [1, 2, 3, 4, 5], [6, 0]], 4)
    positions = torch.tensor([0, 1, 2, 17, 4, 5])
    return ModelInputs(torch.arange(6), positions, meta)


def test_token_layout_positions_and_padding():
    tables, context = token_layout(_mixed_batch().attn_metadata, num_tokens=8, table_width=6)
    assert context.tolist() == [1, 2, 3, 18, 5, 6, 1, 1]  # position + 1; padding tokens see one key
    assert tables[3].tolist() == [1, 2, 3, 4, 5, 0] and tables[5].tolist() == [6, 0, 0, 0, 0, 0]
    assert tables[6:].eq(0).all()


def test_pad_to_host_pads_tokens_and_sequences():
    meta = pad_to_host(_mixed_batch(), num_tokens=16, num_seqs=8, table_width=6)
    assert meta.slot_mapping.tolist()[6:] == [-1] * 10
    assert meta.query_start_loc.tolist() == [0, 3, 4, 6, 6, 6, 6, 6, 6]
    assert meta.seq_lens.tolist() == [3, 18, 6, 0, 0, 0, 0, 0]
    assert meta.block_tables.shape == (8, 6) and meta.block_tables[1].tolist() == [1, 2, 3, 4, 5, 0]
    assert meta.token_tables.shape == (16, 6) and meta.context_lens.shape == (16,)


def test_padded_attention_equals_reference_on_cpu():
    gen = torch.Generator().manual_seed(0)
    inputs = _mixed_batch()
    meta = inputs.attn_metadata
    k_cache, v_cache = (torch.randn(8, 4, 2, 16, generator=gen) for _ in range(2))
    q = torch.randn(6, 4, 16, generator=gen)
    expected = Kernels().paged_attention(q, k_cache, v_cache, meta, 0.25)
    padded = pad_to_host(inputs, num_tokens=16, num_seqs=8, table_width=6)
    got = XlaKernels().paged_attention(torch.cat([q, torch.zeros(10, 4, 16)]), k_cache, v_cache, padded, 0.25)
    torch.testing.assert_close(got[:6], expected)
    assert torch.isfinite(got).all()
