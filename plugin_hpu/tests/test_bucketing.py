"""The bucketing rule beyond the guide's worked examples (those: test_guide_examples.py)."""

import pytest
from plugin_hpu.bucketing import (
    BucketRange,
    HpuBuckets,
    blocks_of,
    decode_buckets,
    default_ranges,
    prompt_buckets,
    read_ranges,
)

GUIDE_PROMPT = [(b, s) for b in (1, 2, 4) for s in range(128, 1025, 128)]  # the guide's 24 prompt buckets


def test_ramp_up_is_cut_at_max_and_never_exceeds_it():
    assert BucketRange(1, 32, 4).values() == [1, 2, 4]
    assert BucketRange(3, 16, 40).values() == [3, 6, 12, 16, 32]
    assert BucketRange(5, 5, 5).values() == [5]


def test_bad_ranges_name_the_dimension():
    with pytest.raises(ValueError, match="PROMPT_BS_BUCKET min 8 is greater than its max 4"):
        BucketRange(8, 1, 4, name="PROMPT_BS_BUCKET")
    with pytest.raises(ValueError, match="must be positive"):
        BucketRange(1, 0, 4)


def test_token_budget_filters_prompt_buckets():
    kept = prompt_buckets(BucketRange(1, 32, 4), BucketRange(128, 128, 1024), max_num_batched_tokens=1024)
    assert all(b * s <= 1024 for b, s in kept)
    assert (4, 256) in kept and (4, 384) not in kept and (1, 1024) in kept
    assert len(kept) == 8 + 4 + 2
    with pytest.raises(ValueError, match="no prompt bucket fits max_num_batched_tokens=64"):
        prompt_buckets(BucketRange(1, 32, 4), BucketRange(128, 128, 1024), max_num_batched_tokens=64)


def test_decode_buckets_limited_by_allocated_blocks():
    assert decode_buckets(BucketRange(1, 2, 2), BucketRange(128, 128, 512), max_blocks=300) == [
        (1, 128), (1, 256), (2, 128), (2, 256),
    ]  # fmt: skip


def test_defaults_follow_vllm():
    defaults = default_ranges(max_num_seqs=128, block_size=128, max_model_len=4096)
    assert defaults == {
        "PROMPT_BS": (1, 32, 64),
        "PROMPT_SEQ": (128, 128, 4096),
        "DECODE_BS": (1, 32, 128),
        "DECODE_BLOCK": (128, 128, 4096),
    }
    small = default_ranges(max_num_seqs=4, block_size=16, max_model_len=256)
    assert small["PROMPT_BS"] == (1, 4, 4) and small["DECODE_BLOCK"] == (16, 16, 128)


def test_env_overrides_only_what_is_set():
    defaults = default_ranges(max_num_seqs=8, block_size=16, max_model_len=512)
    ranges = read_ranges({"PROMPT_SEQ_BUCKET_MAX": 256, "DECODE_BS_BUCKET_STEP": None}, defaults)
    assert ranges["PROMPT_SEQ"].as_tuple() == (16, 16, 256)
    assert ranges["DECODE_BS"].as_tuple() == (1, 8, 8)
    with pytest.raises(ValueError, match="DECODE_BS_BUCKET min 9 is greater than its max 8"):
        read_ranges({"DECODE_BS_BUCKET_MIN": 9}, defaults)


def test_build_and_describe():
    buckets = HpuBuckets.build({}, max_num_seqs=4, block_size=128, max_model_len=1024, max_num_batched_tokens=4096)
    assert buckets.prompt == GUIDE_PROMPT
    assert "Prompt bucket config (min, step, max_warmup) bs:[1, 4, 4], seq:[128, 128, 1024]" in buckets.describe()
    assert buckets.decode_bucket(3, 40) == (4, 128) and buckets.decode_bucket(5, 40) is None


def test_blocks_of():
    assert blocks_of([1, 16, 17], 16) == 1 + 1 + 2
