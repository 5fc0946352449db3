"""Graph-memory budgeting beyond the guide's worked examples (those: test_guide_examples.py)."""

import pytest
from plugin_hpu.bucketing import capture_order
from plugin_hpu.graph_memory import (
    capture_graphs,
    capture_within_budget,
    plan_memory,
    split_graph_memory,
)
from plugins.memory import GiB

DOC_PROMPT = [(b, s) for b in (1, 2, 4) for s in range(128, 1025, 128)]
DOC_DECODE = [(b, s) for b in (1, 2, 4) for s in range(128, 2049, 128)]


def test_defaults_and_eager():
    plan = plan_memory(100 * GiB, 0.9, 0.1)
    assert plan.usable_bytes == 90 * GiB and plan.graph_bytes == 9 * GiB and plan.kv_cache_bytes == 81 * GiB
    eager = plan_memory(100 * GiB, 0.9, 0.1, enforce_eager=True)
    assert eager.graph_bytes == 0 and eager.kv_cache_bytes == 90 * GiB
    with pytest.raises(ValueError, match="GRAPH_RESERVED_MEM must be in"):
        plan_memory(GiB, 0.9, 1.5)


def test_graph_memory_at_capture_time():
    total, prompt, decode = split_graph_memory(10 * GiB, 3 * GiB, 0.3)
    assert (total, prompt, decode) == (7 * GiB, int(2.1 * GiB), 7 * GiB - int(2.1 * GiB))
    assert split_graph_memory(GiB, 2 * GiB, 0.3) == (0, 0, 0)


def linear_cost(per_token, per_seq):
    calls = []

    def capture(bucket, is_prompt):
        calls.append(bucket)
        return bucket[0] * bucket[1] * per_token if is_prompt else bucket[0] * per_seq

    return capture, calls


def test_capture_skips_what_does_not_fit_and_keeps_going():
    capture, calls = linear_cost(per_token=1, per_seq=0)
    order = capture_order(DOC_PROMPT, "min_tokens")
    result = capture_within_budget(order, 3000, capture, is_prompt=True)
    assert result.used_bytes <= 3000 and not result.captured_all
    assert result.captured == calls and result.units == result.used_bytes
    assert result.captured[:4] == [(1, 128), (2, 128), (1, 256), (1, 384)]


def test_leftover_of_a_complete_phase_goes_to_the_other():
    # like the documented run: prompt fills its share, decode captures all cheaply,
    # then prompt continues with the decode share's leftover
    capture, calls = linear_cost(per_token=10, per_seq=1)
    prompt_order = capture_order(DOC_PROMPT, "min_tokens")
    decode_order = capture_order(DOC_DECODE, "max_bs")
    graph_bytes = 60_000
    prompt, decode = capture_graphs(prompt_order, decode_order, graph_bytes, 0.5, capture)
    assert decode.captured_all and len(decode.captured) == 48
    first_pass = capture_within_budget(prompt_order, graph_bytes // 2, capture, True)
    assert len(prompt.captured) > len(first_pass.captured)
    assert prompt.used_bytes + decode.used_bytes <= graph_bytes
    assert len(set(prompt.captured)) == len(prompt.captured)  # no bucket captured twice
    assert not prompt.captured_all


def test_everything_fits():
    capture, _ = linear_cost(per_token=1, per_seq=1)
    prompt, decode = capture_graphs(DOC_PROMPT, DOC_DECODE, 10**9, 0.3, capture)
    assert prompt.captured_all and decode.captured_all
    assert len(prompt.captured) == 24 and len(decode.captured) == 48
