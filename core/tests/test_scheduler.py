"""Scheduler: token budget, decode-first, chunked prefill, preemption, abort, priorities.

Steps are simulated: a fake model whose next token depends only on the tokens so far,
so recomputation after preemption must give exactly the tokens of an undisturbed run.
"""

from __future__ import annotations

import itertools

import pytest
from core.block_manager import BlockManager
from core.scheduler import Scheduler
from core.sequence import Sequence, SequenceStatus
from hypothesis import given, settings
from hypothesis import strategies as st

_ids = itertools.count()


def next_token(tokens: list[int]) -> int:
    return (sum(tokens) * 7 + len(tokens)) % 50


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


def make_seq(prompt, max_tokens=4, priority=0, request_id=None, arrival=None) -> Sequence:
    seq_id = next(_ids)
    arrival = float(seq_id) if arrival is None else arrival
    return Sequence(seq_id, request_id or f"r{seq_id}", list(prompt), max_tokens, arrival, priority)


def make_sched(num_blocks=64, block_size=4, caching=True, **kw) -> Scheduler:
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("max_num_batched_tokens", 64)
    kw.setdefault("max_model_len", 256)
    return Scheduler(BlockManager(num_blocks, block_size, caching), **kw)


def step(sched: Scheduler):
    """One engine step: schedule, check the output, sample, update, stop at max_tokens (= params) or the cap."""
    out = sched.schedule()
    assert out.num_batched_tokens <= sched.max_num_batched_tokens
    assert sched.num_running <= sched.max_num_seqs
    assert len({id(s.seq) for s in out.scheduled}) == len(out.scheduled)
    assert not {id(s) for s in out.preempted} & {id(s.seq) for s in out.scheduled}
    bs = sched.block_manager.block_size
    for s in out.scheduled:
        assert s.num_new_tokens >= 1 and s.start_pos + s.num_new_tokens <= s.seq.num_tokens
        assert len(s.seq.block_table) * bs >= s.start_pos + s.num_new_tokens
    sampled = {s.seq.seq_id: next_token(s.seq.token_ids) for s in out.scheduled if s.needs_sample}
    for seq in sched.update(out, sampled):
        if seq.num_output_tokens >= seq.params or sched.is_capped(seq):
            sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
    return out


def run_to_end(sched: Scheduler, max_steps=500) -> list:
    outs = []
    while sched.has_unfinished():
        assert len(outs) < max_steps, "scheduler made no progress"
        outs.append(step(sched))
    sched.block_manager.check_no_leaks()
    return outs


def test_chunked_prefill_splits_and_resumes():
    sched = make_sched(max_num_batched_tokens=8)
    seq = make_seq(range(20), max_tokens=3)
    sched.add(seq)
    chunks = [(s.start_pos, s.num_new_tokens, s.needs_sample) for o in run_to_end(sched) for s in o.scheduled]
    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True), (20, 1, True), (21, 1, True)]
    assert seq.output_token_ids == reference(range(20), 3)


def test_decode_first_then_waiting_fills_the_budget():
    sched = make_sched(max_num_batched_tokens=8)
    a, b = make_seq([1, 2, 3], max_tokens=10), make_seq(range(20))
    sched.add(a)
    step(sched)
    sched.add(b)
    out = step(sched)
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 7)]
    out = step(sched)  # b, partly prefilled, is running too: still after the decode
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(a, 1), (b, 7)]
    run_to_end(sched)
    assert a.output_token_ids == reference([1, 2, 3], 10)


def test_without_chunking_a_prompt_waits_for_the_whole_budget():
    with pytest.raises(ValueError, match="max_model_len"):
        make_sched(max_num_batched_tokens=8, max_model_len=16, enable_chunked_prefill=False)
    sched = make_sched(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    a, b = make_seq([1, 2], max_tokens=3), make_seq(range(16), max_tokens=1)
    sched.add(a)
    step(sched)
    sched.add(b)
    assert [s.seq for s in step(sched).scheduled] == [a]  # 15 tokens left: b does not fit
    run_to_end(sched)
    assert b.output_token_ids == reference(range(16), 1)


def test_preemption_by_recompute_when_the_cache_runs_out():
    sched = make_sched(num_blocks=6, block_size=4)
    seqs = [make_seq([i, i + 1, i + 2, 5, 6, 7], max_tokens=10) for i in range(3)]
    for seq in seqs:
        sched.add(seq)
    outs = run_to_end(sched)
    preempted = [s for o in outs for s in o.preempted]
    assert preempted and sched.num_preemptions == len(preempted)
    assert seqs[2] in preempted  # the latest arrival goes first
    for seq in seqs:
        assert seq.status is SequenceStatus.FINISHED_LENGTH
        assert seq.output_token_ids == reference(seq.prompt_token_ids, 10)


def test_preempted_sequence_is_readmitted_before_later_arrivals():
    sched = make_sched(num_blocks=4, block_size=2, max_num_seqs=2)
    a, b = make_seq([1, 2, 3], max_tokens=5), make_seq([4, 5, 6], max_tokens=5)
    late = make_seq([7], max_tokens=1)
    for seq in (a, b, late):
        sched.add(seq)
    out = step(sched)
    while not out.preempted:
        out = step(sched)
    assert out.preempted == [b] and b.status is SequenceStatus.WAITING and b.num_computed_tokens == 0
    admitted = [s.seq for o in run_to_end(sched) for s in o.scheduled if s.start_pos == 0]
    assert admitted.index(b) < admitted.index(late)
    assert b.output_token_ids == reference([4, 5, 6], 5) and late.output_token_ids == reference([7], 1)


def test_lowest_priority_running_sequence_is_preempted():
    sched = make_sched(num_blocks=4, block_size=2)
    low, high = make_seq([1, 2, 3], max_tokens=5, priority=5), make_seq([4, 5, 6], max_tokens=5, priority=1)
    sched.add(low)
    sched.add(high)
    preempted = [s for o in run_to_end(sched) for s in o.preempted]
    assert preempted and set(preempted) == {low}


def test_priority_then_arrival_order():
    sched = make_sched(max_num_seqs=1)
    seqs = [make_seq([i], max_tokens=1, priority=p) for i, p in enumerate([2, 0, 1, 0])]
    for seq in seqs:
        sched.add(seq)
    order = [s.seq for o in run_to_end(sched) for s in o.scheduled]
    assert order == [seqs[1], seqs[3], seqs[2], seqs[0]]


def test_max_num_seqs_is_respected():
    sched = make_sched(max_num_seqs=2)
    seqs = [make_seq([i, i], max_tokens=3) for i in range(5)]
    for seq in seqs:
        sched.add(seq)
    outs = run_to_end(sched)
    assert max(len(o.scheduled) for o in outs) == 2
    assert all(s.output_token_ids == reference(s.prompt_token_ids, 3) for s in seqs)


def test_abort_waiting_and_running():
    sched = make_sched(max_num_seqs=1)
    running, waiting = make_seq([1, 2, 3], request_id="a"), make_seq([4, 5], request_id="b")
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert (sched.num_running, sched.num_waiting) == (1, 1)
    assert sched.abort("b") == [waiting] and sched.abort("a") == [running]
    assert sched.abort("nope") == []
    assert running.status is waiting.status is SequenceStatus.FINISHED_ABORTED
    assert not sched.has_unfinished() and running.block_table == []
    sched.block_manager.check_no_leaks()


def test_abort_between_schedule_and_update_and_siblings():
    sched = make_sched()
    siblings = [make_seq([1, 2, 3], request_id="n2") for _ in range(2)]
    for seq in siblings:
        sched.add(seq)
    out = sched.schedule()
    assert sched.abort("n2") == siblings
    assert sched.update(out, {s.seq_id: 0 for s in siblings}) == []
    assert all(s.num_output_tokens == 0 for s in siblings)
    sched.block_manager.check_no_leaks()


def test_prefix_cache_hit_is_recorded_when_first_scheduled():
    sched = make_sched(block_size=4)
    first = make_seq(range(10), max_tokens=1)
    sched.add(first)
    run_to_end(sched)
    second = make_seq(range(10), max_tokens=2)
    sched.add(second)
    out = step(sched)
    assert [(s.start_pos, s.num_new_tokens) for s in out.scheduled] == [(8, 2)]
    assert second.num_cached_tokens == 8
    run_to_end(sched)
    assert second.output_token_ids == reference(range(10), 2)


def test_length_caps_max_model_len_and_cache_size():
    sched = make_sched(max_model_len=6)
    seq = make_seq([1, 2, 3, 4], max_tokens=100)
    sched.add(seq)
    run_to_end(sched)
    assert seq.status is SequenceStatus.FINISHED_LENGTH and seq.num_tokens == 6
    sched = make_sched(num_blocks=2, block_size=4)  # the whole cache holds 8 tokens
    seq = make_seq([1, 2, 3], max_tokens=100)
    sched.add(seq)
    run_to_end(sched)
    assert seq.num_tokens == 9 and seq.output_token_ids == reference([1, 2, 3], 6)
    assert sched.can_ever_fit(8) and not sched.can_ever_fit(9)


def test_add_rejects_prompts_that_can_never_run():
    sched = make_sched(num_blocks=2, block_size=4, max_model_len=10)
    with pytest.raises(ValueError, match="max_model_len"):
        sched.add(make_seq(range(11)))
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(make_seq(range(9)))
    with pytest.raises(ValueError, match="no tokens"):
        make_seq([])
    assert not sched.has_unfinished()


def test_finish_is_idempotent_and_checks_status():
    sched = make_sched()
    seq = make_seq([1, 2])
    sched.add(seq)
    with pytest.raises(ValueError, match="FINISHED_"):
        sched.finish(seq, SequenceStatus.RUNNING)
    sched.finish(seq, SequenceStatus.FINISHED_STOPPED)
    sched.finish(seq, SequenceStatus.FINISHED_ABORTED)
    assert seq.finish_reason == "stop" and not sched.has_unfinished()


request = st.tuples(
    st.lists(st.integers(0, 3), min_size=1, max_size=24),  # a tiny vocabulary: many shared prefixes
    st.integers(1, 16),  # max_tokens
    st.integers(0, 2),  # priority
    st.integers(0, 6),  # the step at which it arrives
    st.booleans(),  # aborted two steps after arrival
)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(request, min_size=1, max_size=10),
    num_blocks=st.integers(5, 16),
    block_size=st.sampled_from([1, 2, 4]),
    budget=st.integers(4, 40),
    max_num_seqs=st.integers(1, 4),
    caching=st.booleans(),
)
def test_random_workloads_finish_correctly_without_leaks(
    requests, num_blocks, block_size, budget, max_num_seqs, caching
):
    chunked = budget < 40
    sched = make_sched(
        num_blocks, block_size, caching, max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
        max_model_len=40, enable_chunked_prefill=chunked,
    )  # fmt: skip
    seqs = [make_seq(p, max_tokens=m, priority=pr, arrival=t) for p, m, pr, t, _ in requests]
    rejected = set()
    for t in range(1000):
        for seq, (_, _, _, arrive, abort) in zip(seqs, requests, strict=True):
            if t == arrive and sched.can_ever_fit(seq.num_prompt_tokens):
                sched.add(seq)
            elif t == arrive:
                with pytest.raises(ValueError):
                    sched.add(seq)
                rejected.add(seq.seq_id)
            if abort and t == arrive + 2:
                sched.abort(seq.request_id)
        if t > 8 and not sched.has_unfinished():
            break
        step(sched)
    sched.block_manager.check_no_leaks()
    for seq, (prompt, max_tokens, _, _, abort) in zip(seqs, requests, strict=True):
        if seq.seq_id in rejected:
            continue
        assert seq.is_finished
        expected = reference(prompt, max_tokens)
        capacity = max(min(40, num_blocks * block_size + 1) - len(prompt), 1)
        if seq.status is SequenceStatus.FINISHED_ABORTED:
            assert abort and seq.output_token_ids == expected[: seq.num_output_tokens]
        else:
            assert seq.output_token_ids == expected[:capacity]


def test_burst_is_prefilled_in_arrival_order_and_the_first_decode_early():
    """Eight 141-token prompts at once, budget 128: first tokens come in arrival order, one
    request after another, and each decode runs in every step after its prefill."""
    sched = make_sched(num_blocks=512, max_num_batched_tokens=128, max_model_len=512)
    burst = [make_seq([i] * 141, max_tokens=4, arrival=100.0 + i) for i in range(8)]
    for seq in reversed(burst):  # added out of order: their arrival stamps decide
        sched.add(seq)
    first_token_step: dict[int, int] = {}
    outs = []
    while sched.has_unfinished():
        out = step(sched)
        outs.append(out)
        for s in out.scheduled:
            if s.needs_sample and s.start_pos < s.seq.num_prompt_tokens:
                first_token_step[s.seq.seq_id] = len(outs)
    order = sorted(first_token_step, key=first_token_step.get)
    assert order == [seq.seq_id for seq in burst]
    # 141 tokens at 128 a step: the first request's first token comes in step 2, not after the whole burst
    assert first_token_step[burst[0].seq_id] == 2
    assert [first_token_step[s.seq_id] for s in burst] == sorted(first_token_step.values())
    assert first_token_step[burst[-1].seq_id] >= 8 * 141 // 128
    for seq in burst:
        assert seq.output_token_ids == reference(seq.prompt_token_ids, 4)


def test_decodes_are_never_stalled_by_a_long_prompt():
    """A 1000-token prompt of higher priority arrives while three sequences decode: every step
    still carries each decode, and no step exceeds the budget (the stated bound)."""
    budget = 64
    sched = make_sched(num_blocks=512, max_num_batched_tokens=budget, max_model_len=2048)
    decoders = [make_seq([i, i + 1], max_tokens=30) for i in range(3)]
    for seq in decoders:
        sched.add(seq)
    step(sched)
    long = make_seq(range(1000), max_tokens=2, priority=-1)
    sched.add(long)
    num_prefill_steps = 0
    while any(not s.is_finished for s in decoders):
        num_live = sum(not s.is_finished for s in decoders)
        prompt_left = long.num_prompt_tokens - long.num_computed_tokens
        out = step(sched)
        assert out.num_batched_tokens <= budget
        got = {s.seq.seq_id: s.num_new_tokens for s in out.scheduled}
        assert [got.get(seq.seq_id) for seq in decoders if seq.seq_id in got] == [1] * num_live
        if prompt_left > 0:  # the prompt takes what the decodes left
            assert got[long.seq_id] == min(prompt_left, budget - num_live)
            num_prefill_steps += 1
    assert num_prefill_steps == 17  # ceil(1000 / 61): the prompt ran beside the decodes
    run_to_end(sched)
    assert long.output_token_ids == reference(range(1000), 2)
    for seq in decoders:
        assert seq.output_token_ids == reference(seq.prompt_token_ids, 30)
