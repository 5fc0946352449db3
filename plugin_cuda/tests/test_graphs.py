"""Capture-size selection, static input buffers and split-K planning (no device needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from plugin_cuda.graphs import StaticInputs, default_capture_sizes, padded_size, select_capture_sizes
from plugins.attention import AttentionMetadata
from plugins.gpu_triton.splits import MAX_SPLITS, plan_decode_splits
from plugins.runner import ModelInputs, pad_inputs


def config(**kw):
    defaults = {"enforce_eager": False, "max_num_seqs": 64, "kv_cache_dtype": "bfloat16", "pipeline_parallel_size": 1}
    return SimpleNamespace(**{**defaults, **kw})


def test_default_capture_sizes_like_vllm() -> None:
    assert default_capture_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert default_capture_sizes(20) == (1, 2, 4, 8, 16, 20)  # max_num_seqs itself is captured
    assert default_capture_sizes(3) == (1, 2, 3)
    assert default_capture_sizes(1) == (1,)
    assert len(default_capture_sizes(512)) == 3 + 64


def test_select_capture_sizes() -> None:
    sizes, why = select_capture_sizes(config(), None, True)
    assert sizes == default_capture_sizes(64) and "default" in why
    assert select_capture_sizes(config(enforce_eager=True), None, True) == ((), "enforce_eager is set")
    sizes, why = select_capture_sizes(config(pipeline_parallel_size=2), None, True)
    assert sizes == () and why.startswith("pipeline parallel")
    sizes, why = select_capture_sizes(config(kv_cache_dtype="fp8_e4m3"), None, True)
    assert sizes == () and "kv_cache_dtype fp8_e4m3 runs the torch reference" in why
    sizes, why = select_capture_sizes(config(), None, False)
    assert sizes == () and "not graph-safe" in why
    assert select_capture_sizes(config(max_num_seqs=6), (1, 4, 8, 16), True) == ((1, 4), "CUDA_GRAPH_SIZES")
    sizes, why = select_capture_sizes(config(max_num_seqs=6), (8, 16), True)
    assert sizes == () and "max_num_seqs=6" in why


@pytest.mark.parametrize("num_seqs,want", [(1, 1), (3, 4), (4, 4), (5, 8), (8, 8), (9, None)])
def test_padded_size(num_seqs, want) -> None:
    assert padded_size((1, 2, 4, 8), num_seqs) == want


def decode_inputs(seq_lens: list[int], block_size: int = 4) -> ModelInputs:
    tables, start = [], 0
    for s in seq_lens:
        n = -(-s // block_size)
        tables.append(list(range(start + 1, start + 1 + n)))
        start += n
    meta = AttentionMetadata.build([1] * len(seq_lens), seq_lens, tables, block_size)
    ids = torch.arange(10, 10 + len(seq_lens))
    return ModelInputs(ids, torch.tensor(seq_lens) - 1, meta)


def test_static_inputs_hold_exactly_the_padded_batch() -> None:
    static = StaticInputs.allocate(8, 6, "cpu")
    # a larger batch first leaves stale rows behind ...
    static.load(pad_inputs(decode_inputs([9, 2, 20, 7, 3, 1, 5]), 8))
    # ... which the next, smaller batch must overwrite with padding
    small = decode_inputs([13, 6, 2])
    padded = pad_inputs(small, 4)
    static.load(padded)
    view = static.inputs(4, max_seq_len=24)
    meta, want = view.attn_metadata, padded.attn_metadata
    assert torch.equal(view.input_ids, padded.input_ids)
    assert torch.equal(view.positions, padded.positions)
    assert torch.equal(meta.query_start_loc, want.query_start_loc)
    assert torch.equal(meta.seq_lens, want.seq_lens)
    assert torch.equal(meta.slot_mapping, want.slot_mapping)
    width = want.block_tables.shape[1]
    assert torch.equal(meta.block_tables[:, :width], want.block_tables)
    assert meta.query_lens_host == [1] * 4 and meta.seq_lens_host == [24] * 4  # worst case, for grid sizes
    assert meta.slot_mapping[3] == -1 and meta.seq_lens[3] == 0


def test_static_inputs_initially_padding_and_reject_oversize() -> None:
    static = StaticInputs.allocate(4, 2, "cpu")
    assert torch.all(static.slot_mapping == -1) and torch.all(static.seq_lens == 0)
    assert torch.equal(static.query_start_loc, torch.arange(5, dtype=torch.int32))
    too_wide = decode_inputs([12])  # 3 blocks of 4
    assert not static.fits(too_wide)
    with pytest.raises(ValueError, match="does not fit static buffers of 4 x 2"):
        static.load(too_wide)


def test_plan_decode_splits() -> None:
    # plenty of programs already: one split
    assert plan_decode_splits(256, 8, 4096, 132, 256, 64).num_splits == 1
    # one long sequence on a big GPU: split, at most MAX_SPLITS
    one = plan_decode_splits(1, 8, 32768, 132, 256, 64)
    assert one.num_splits == MAX_SPLITS and one.tokens_per_split == 1024
    # never shorter than min_split_tokens, always a multiple of the tile
    short = plan_decode_splits(1, 1, 300, 132, 256, 64)
    assert short == plan_decode_splits(1, 1, 300, 132, 256, 64)
    assert short.tokens_per_split == 256 and short.num_splits == 2
    for seqs, length in [(1, 1), (3, 17), (7, 5000), (64, 100000)]:
        plan = plan_decode_splits(seqs, 2, length, 108, 64, 32)
        assert plan.tokens_per_split % 32 == 0
        assert plan.num_splits * plan.tokens_per_split >= length
        assert (plan.num_splits - 1) * plan.tokens_per_split < length
    with pytest.raises(ValueError, match="num_sms=0"):
        plan_decode_splits(1, 1, 10, 0, 16, 16)
