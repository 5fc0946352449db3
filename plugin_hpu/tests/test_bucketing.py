"""The bucketing rule, checked against the numbers in vLLM's Gaudi documentation."""

import pytest
from plugin_hpu.bucketing import (
    BucketRange,
    HpuBuckets,
    blocks_of,
    capture_order,
    decode_buckets,
    default_ranges,
    find_value,
    prompt_buckets,
    read_ranges,
    warmup_order,
)

# vLLM's logged example: prompt bs [1, 32, 4] seq [128, 128, 1024]; decode bs [1, 128, 4] seq [128, 128, 2048]
DOC_PROMPT = [(b, s) for b in (1, 2, 4) for s in range(128, 1025, 128)]
DOC_DECODE = [(b, s) for b in (1, 2, 4) for s in range(128, 2049, 128)]


def test_ramp_up_then_linear():
    assert BucketRange(2, 32, 64).values() == [2, 4, 8, 16, 32, 64]
    assert BucketRange(128, 128, 512).values() == [128, 256, 384, 512]


def test_ramp_up_is_cut_at_max_and_never_exceeds_it():
    assert BucketRange(1, 32, 4).values() == [1, 2, 4]
    assert BucketRange(3, 16, 40).values() == [3, 6, 12, 16, 32]
    assert BucketRange(5, 5, 5).values() == [5]


def test_bad_ranges_name_the_dimension():
    with pytest.raises(ValueError, match="PROMPT_BS_BUCKET min 8 is greater than its max 4"):
        BucketRange(8, 1, 4, name="PROMPT_BS_BUCKET")
    with pytest.raises(ValueError, match="must be positive"):
        BucketRange(1, 0, 4)


def test_documented_prompt_and_decode_bucket_lists():
    prompt = prompt_buckets(BucketRange(1, 32, 4), BucketRange(128, 128, 1024))
    decode = decode_buckets(BucketRange(1, 128, 4), BucketRange(128, 128, 2048))
    assert prompt == DOC_PROMPT and len(prompt) == 24
    assert decode == DOC_DECODE and len(decode) == 48


def test_documented_padding_example():
    buckets = HpuBuckets(ranges={}, prompt=DOC_PROMPT, decode=DOC_DECODE)
    assert buckets.prompt_bucket(3, 412) == (4, 512)  # 3 sequences, longest 412 tokens
    assert buckets.decode_bucket(3, 412) == (4, 512)
    assert buckets.decode_bucket(2, 500) == (2, 512)  # a request finished
    assert buckets.decode_bucket(4, 513) == (4, 640)  # the context crossed 512
    assert buckets.prompt_bucket(5, 100) is None  # over every bucket: runs unpadded
    assert buckets.prompt_bucket(1, 1025) is None


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
    assert buckets.prompt == DOC_PROMPT
    assert "prompt bucket config (min, step, max) bs:[1, 4, 4] seq:[128, 128, 1024], 24 buckets" in buckets.describe()


def test_find_value_and_blocks_of():
    assert find_value(3, [1, 2, 4, 8]) == 4
    assert find_value(4, [1, 2, 4, 8]) == 4
    assert find_value(9, [1, 2, 4, 8]) is None
    assert blocks_of([1, 16, 17], 16) == 1 + 1 + 2


def test_warmup_order_matches_the_documented_log():
    order = warmup_order(DOC_PROMPT)
    assert order[:3] == [(4, 1024), (4, 896), (4, 768)] and order[-1] == (1, 128)
    assert warmup_order(DOC_DECODE)[:3] == [(4, 2048), (4, 1920), (4, 1792)]


def test_capture_strategies_match_the_documented_log():
    prompt = capture_order(DOC_PROMPT, "min_tokens")
    assert prompt[0] == (1, 128) and prompt[10] == (1, 896)  # [Graph/Prompt][11/24]
    assert prompt[11:15] == [(4, 256), (2, 512), (1, 1024), (2, 640)]  # [12/24] ... [15/24]
    decode = capture_order(DOC_DECODE, "max_bs")
    assert decode[0] == (4, 128) and decode[-1] == (1, 2048)
    doc_max_bs = [(64, 128), (64, 256), (32, 128), (32, 256), (1, 128), (1, 256)]
    assert capture_order(reversed(doc_max_bs), "max_bs") == doc_max_bs
    with pytest.raises(ValueError, match="min_tokens, max_bs"):
        capture_order(DOC_PROMPT, "biggest")
