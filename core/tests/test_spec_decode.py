"""Speculative decoding's parts: the config, n-gram proposals, and the scheduler's lookahead
slots and rollback (a simulated target that drafts are checked against)."""

from __future__ import annotations

import itertools

import pytest
from core.block_manager import BlockManager
from core.scheduler import Scheduler
from core.sequence import Sequence, SequenceStatus
from core.spec_decode import SpeculativeConfig, num_accepted, propose_ngram, row_outputs

_ids = itertools.count()


def test_config_defaults_and_errors():
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (5, 5)
    c = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (4, 4)
    c = SpeculativeConfig.from_dict({"method": "draft_model", "model": "draft.gguf", "num_speculative_tokens": 2})
    assert (c.model, c.num_speculative_tokens) == ("draft.gguf", 2)
    bad = [
        ({"method": "eagle", "num_speculative_tokens": 3}, "method must be one of ngram"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer >= 1"),
        ({"method": "ngram"}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}, "<="),
        ({"method": "ngram", "num_speculative_tokens": 2, "model": "x"}, "unknown key(s) model"),
        ({"method": "draft_model", "num_speculative_tokens": 2}, "method draft_model needs model"),
        ({"method": "draft_model", "model": "x", "num_speculative_tokens": 2, "prompt_lookup_max": 3}, "unknown key"),
    ]
    for config, message in bad:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            SpeculativeConfig.from_dict(config)


def test_ngram_proposes_what_followed_the_longest_latest_suffix():
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]
    assert propose_ngram(tokens, 3, 1, 2) == [5, 6, 7]  # [2, 3] latest at 5..6
    assert propose_ngram(tokens + [4], 2, 1, 3) == [9, 2]  # the 3-token suffix [2, 3, 4] at 1..3
    assert propose_ngram([1, 2, 3], 2, 1, 3) == []
    assert propose_ngram([7, 7], 4, 1, 1) == [7]  # continuation cut at the end
    # a byte pattern that matches across token boundaries is not a match
    assert propose_ngram([0x02000000, 0, 7, 2], 1, 1, 1) == []
    assert propose_ngram([2, 5, 0x02000000, 0, 2], 1, 1, 1) == [5]


def test_ngram_prefers_the_occurrence_at_or_after_the_source():
    from core.spec_decode.ngram import find_ngram

    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 7, 2, 3]  # [2, 3] at 1..2 (continuation at 3) and 5..6 (at 7)
    assert find_ngram(tokens, 1, 2) == (2, 7)  # no source: the latest
    assert find_ngram(tokens, 1, 2, source=3) == (2, 3)
    assert find_ngram(tokens, 1, 2, source=2) == (2, 3)  # the first at or after the source
    assert find_ngram(tokens, 1, 2, source=4) == (2, 7)
    assert find_ngram(tokens, 1, 2, source=8) == (2, 7)  # none at or after it: the latest
    assert find_ngram([5, 0x02000000, 0, 7, 2, 9, 2], 1, 1, source=2) == (1, 5)  # an unaligned hit is skipped


def test_acceptance_rule_and_row_outputs():
    assert num_accepted([5, 6, 7], [5, 6]) == 2
    assert num_accepted([5, 8, 7], [5, 6]) == 1
    assert num_accepted([4], []) == 0
    assert row_outputs([1], [5, 6]) == [[1], [1, 5], [1, 5, 6]]


def target(tokens: list[int]) -> int:
    return (sum(tokens) * 7 + len(tokens)) % 50


def test_scheduler_reserves_lookahead_rolls_back_and_caches_only_computed_blocks():
    """Sequences speculate (drafts right for a while, then wrong) in a cache small enough to
    preempt; the simulated KV written each step (drafts included) must equal the tokens of
    every computed block, outputs equal a plain run, and no block leaks."""
    bs, max_tokens = 4, 24
    bm = BlockManager(20, bs, True)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=24, max_model_len=128)
    kv: dict[int, dict[int, int]] = {}
    seqs = []
    for i in range(4):
        seq = Sequence(next(_ids), f"r{i}", [i + 1] * 9, max_tokens, float(i))
        seqs.append(seq)
        sched.add(seq)
    want = {}
    for seq in seqs:
        tokens = list(seq.prompt_token_ids)
        for _ in range(max_tokens):
            tokens.append(target(tokens))
        want[seq.seq_id] = tokens[len(seq.prompt_token_ids) :]
    steps = speculated = 0
    while sched.has_unfinished():
        steps += 1
        assert steps < 400
        drafts = {}
        for seq in sched.decoding():  # right for 2 tokens, then one wrong
            n = seq.num_output_tokens
            drafts[seq.seq_id] = want[seq.seq_id][n : n + 2] + [99]
        out = sched.schedule(drafts)
        for item in out.scheduled:
            seq, start = item.seq, item.start_pos
            ids = seq.token_ids[start : start + item.num_new_tokens - len(item.draft_token_ids)] + list(
                item.draft_token_ids
            )
            assert len(seq.block_table) * bs >= start + len(ids)
            for pos, token in enumerate(ids, start):
                kv.setdefault(seq.block_table[pos // bs], {})[pos % bs] = token
            if item.needs_sample:
                run, tokens = list(item.draft_token_ids), list(seq.token_ids)
                sampled = []
                for j in range(len(run) + 1):
                    sampled.append(target(tokens + run[:j]))
                speculated += bool(run)
                for token in sampled[: num_accepted(sampled, run) + 1]:
                    if seq.num_output_tokens < max_tokens:
                        seq.append_token(token)
        sched.advance(out)
        for item in out.scheduled:
            seq = item.seq
            for index in range(seq.num_computed_tokens // bs):
                block = kv[seq.block_table[index]]
                assert [block[i] for i in range(bs)] == seq.token_ids[index * bs : (index + 1) * bs]
            if seq.num_output_tokens >= max_tokens and not seq.is_finished:
                sched.finish(seq, SequenceStatus.FINISHED_LENGTH)
    assert speculated > 10 and sched.num_preemptions > 0
    for seq in seqs:
        assert seq.output_token_ids == want[seq.seq_id]
    bm.check_no_leaks()


def test_acceptance_rate_is_logged_periodically(caplog, monkeypatch):
    import logging

    from core.spec_decode import SpecDecoder, decoder

    spec = SpecDecoder(SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2}), 64)
    monkeypatch.setattr(decoder, "LOG_INTERVAL_S", 0.0)
    with caplog.at_level(logging.INFO, logger="core.spec_decode.decoder"):
        spec.record(0, 2, 1)
        spec.record(0, 2, 2)
    assert "1 of 2 draft tokens accepted (50.0%)" in caplog.text
    assert spec.stats() == {
        "num_drafts": 2,
        "num_draft_tokens": 4,
        "num_accepted_tokens": 3,
        "num_accepted_tokens_per_pos": [2, 1],
    }


def test_a_sequence_that_accepts_nothing_backs_off():
    from core.sampling_params import SamplingParams
    from core.spec_decode import SpecDecoder

    # matches of 2 tokens at most: weaker than STRONG_MATCH, so the back-off holds
    spec = SpecDecoder(
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}), 256
    )
    seq = Sequence(next(_ids), "r", [1, 2, 3, 4, 5] * 4, SamplingParams(max_tokens=100), 0.0)
    proposed = []
    for _ in range(40):
        drafts = spec.propose([seq], _no_grammar)
        proposed.append(bool(drafts))
        if drafts:
            spec.record(seq.seq_id, len(drafts[seq.seq_id]), 0)
    # runs at steps 0, 3, 8, 17, 34: waits of 2, 4, 8, 16 steps between them
    assert [i for i, p in enumerate(proposed) if p] == [0, 3, 8, 17, 34]
    spec.record(seq.seq_id, 2, 1)  # one accepted draft ends the back-off
    assert spec.propose([seq], _no_grammar) and spec.propose([seq], _no_grammar)
    assert (
        spec.propose([], _no_grammar) == {} and not spec._waits and not spec._misses
    )  # a finished sequence leaves nothing


def test_ngram_draft_length_follows_acceptance_and_the_match_and_strong_matches_skip_the_back_off():
    from core.sampling_params import SamplingParams
    from core.spec_decode import SpecDecoder, decoder

    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 8}
    spec = SpecDecoder(SpeculativeConfig.from_dict(config), 256)
    # a 2-token match ([1, 2] recurs, [0, 1, 2] does not): the acceptance history sets the length
    short = Sequence(next(_ids), "s", [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2], SamplingParams(max_tokens=100), 0.0)
    lengths = []
    for accepted in (1, 2, 1):  # of the drafts proposed: 4, then 2 (1 + 1), 4 (a whole run doubles), 2
        drafts = spec.propose([short], _no_grammar)[short.seq_id]
        assert drafts == [3, 4, 5, 6][: len(drafts)]
        lengths.append(len(drafts))
        spec.record(short.seq_id, len(drafts), min(accepted, len(drafts)))
    lengths.append(len(spec.propose([short], _no_grammar)[short.seq_id]))
    assert lengths == [4, 2, 4, 2]
    # an 8-token match (text being copied) proposes num_speculative_tokens after a short run that accepted
    seq = Sequence(next(_ids), "r", [1, 2, 3, 4, 5, 6, 7] * 3, SamplingParams(max_tokens=100), 0.0)
    spec.propose([seq], _no_grammar)
    spec.record(seq.seq_id, 4, 1)
    assert spec.propose([seq], _no_grammar) == {seq.seq_id: [1, 2, 3, 4]}
    # after a run that accepted none: the history's length (0 + 1), the match no longer counts;
    # backing off, yet the 8-token suffix recurs: drafts
    spec.record(seq.seq_id, 4, 0)
    assert spec._waits[seq.seq_id] == 2 and decoder.STRONG_MATCH <= 8
    assert spec.propose([seq], _no_grammar) == {seq.seq_id: [1]}
    for _ in range(20):  # repeated structure whose content differs: one draft a step, not num_speculative_tokens
        spec.record(seq.seq_id, 1, 0)
        assert spec.propose([seq], _no_grammar) == {seq.seq_id: [1]}
    # a weak match (2 tokens: [8, 1] recurs only as a pair) waits out the back-off
    weak = Sequence(next(_ids), "w", [8, 1, 9, 9, 9, 9, 2, 8, 1], SamplingParams(max_tokens=100), 0.0)
    spec.propose([weak], _no_grammar)
    spec.record(weak.seq_id, 1, 0)
    assert spec.propose([weak], _no_grammar) == {} and spec.propose([weak], _no_grammar) == {}
    assert spec.propose([weak], _no_grammar) == {weak.seq_id: [9]}


def test_a_copy_resumes_at_its_source_after_the_model_changes_a_word():
    from core.sampling_params import SamplingParams
    from core.spec_decode import SpecDecoder, decoder

    config = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 8}
    spec = SpecDecoder(SpeculativeConfig.from_dict(config), 256)
    text = list(range(10, 40))
    seq = Sequence(next(_ids), "r", [*text, 33, 5, 0, 10, 11], SamplingParams(max_tokens=100), 0.0)
    for _ in range(4):  # the copy: four whole runs, each with the target's next token
        drafts = spec.propose([seq], _no_grammar)[seq.seq_id]
        assert len(drafts) == 4
        spec.record(seq.seq_id, 4, 4)
        for token in [*drafts, drafts[-1] + 1]:
            seq.append_token(token)
    assert seq.token_ids[-1] == 31 and spec.propose([seq], _no_grammar)[seq.seq_id] == [32, 33, 34, 35]
    spec.record(seq.seq_id, 4, 0)  # the model writes 77 for 32: its source was at text index 22
    seq.append_token(77)
    assert spec.propose([seq], _no_grammar) == {}  # [77] occurs nowhere
    seq.append_token(33)
    # [33] occurs at text index 23 (then 34) and later (then 5): the copy resumes at the source,
    # with RESUME_DRAFTS drafts, not the one draft that the run's history alone gives
    assert decoder.RESUME_DRAFTS == 2
    assert spec.propose([seq], _no_grammar) == {seq.seq_id: [34, 35]}
    spec.record(seq.seq_id, 2, 2)
    for token in (34, 35, 36):
        seq.append_token(token)
    assert spec.propose([seq], _no_grammar) == {seq.seq_id: [37, 38, 39, 33]}  # the match's length again
    other = Sequence(next(_ids), "o", [1, 2, 1], SamplingParams(max_tokens=100), 0.0)
    assert spec.propose([seq, other], _no_grammar) == {seq.seq_id: [37, 38, 39, 33], other.seq_id: [2, 1]}


def test_a_sequence_that_often_accepts_does_not_back_off_after_a_miss():
    from core.sampling_params import SamplingParams
    from core.spec_decode import SpecDecoder, decoder

    config = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2}
    spec = SpecDecoder(SpeculativeConfig.from_dict(config), 256)
    seq = Sequence(next(_ids), "r", [1, 2, 3, 4, 5] * 4, SamplingParams(max_tokens=100), 0.0)
    for accepted in (1, 1, 1):
        spec.record(seq.seq_id, 2, accepted)
    assert (decoder.RECENT_RUNS, decoder.KEEP_SPECULATING) == (8, 0.25)
    # accepted in 3 of the last 4 runs, ..., 3 of the last 8, 2 of the last 8: no back-off after the misses
    for _ in range(6):
        spec.record(seq.seq_id, 2, 0)
        assert spec.propose([seq], _no_grammar) and not spec._waits
    spec.record(seq.seq_id, 2, 0)  # 1 of the last 8: below a quarter
    assert spec._waits[seq.seq_id] == decoder.MAX_BACKOFF_STEPS  # 2 ** 7 for 7 misses in a row, capped
    assert spec.propose([seq], _no_grammar) == {}


def _no_grammar(seq: Sequence) -> None:
    return None


def test_rejection_sampling_keeps_the_target_distribution():
    """A draft drawn from q, verified against p by :func:`core.sampler.verify_run`, 20000 times: the
    kept token (the accepted draft or the residual's draw) has p's distribution, not q's."""
    import torch
    from core.sampler import DraftRun, verify_run
    from scipy.stats import chisquare

    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.25, 0.05])
    gen = torch.Generator().manual_seed(0)
    drafts = torch.multinomial(q, 20000, replacement=True, generator=gen).tolist()
    counts = [0] * 4
    for draft in drafts:
        sampled = torch.tensor([-1, -1])
        verify_run(sampled, {0: p}, DraftRun(0, [draft], q.unsqueeze(0)), gen)
        counts[int(sampled[0])] += 1
    assert chisquare(counts, (p * 20000).tolist()).pvalue > 1e-3, counts
    assert chisquare(counts, (q * 20000).tolist()).pvalue < 1e-6, counts
