"""Sampler: each logits transform against a hand-written reference, seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch
from core.sampler import (
    Sampler,
    SamplingState,
    apply_logit_bias,
    apply_min_p,
    apply_min_tokens,
    apply_penalties_from_states,
    apply_top_k_top_p,
    exponential_race,
    first_argmax,
    make_generator,
    prompt_logprobs_for,
)
from core.sampling_params import SamplingParams

V = 64


def state(outputs=(), prompt=(1, 2, 3), generator=None, stop_ids=(), **params) -> SamplingState:
    return SamplingState(SamplingParams(**params), list(prompt), list(outputs), generator, list(stop_ids))


def rand_logits(n: int, vocab: int = V, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def finite_set(row: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(row)).flatten().tolist())


def test_greedy_is_argmax_of_raw_logits():
    logits = rand_logits(5)
    out = Sampler()(logits, [state(temperature=0.0) for _ in range(4)] + [state(top_k=1)])
    assert out.token_ids == logits.argmax(-1).tolist()
    assert out.logprobs == [None] * 5 and out.top_logprobs == [None] * 5


@pytest.mark.parametrize("vocab", [1, 127, 128, 129, 300, 49152 + 5])
@pytest.mark.parametrize("block", [1, 7, 128])
def test_first_argmax_is_max_dim_indices_with_ties_nan_and_inf(vocab, block):
    g = torch.Generator().manual_seed(vocab * 131 + block)
    for trial in range(40):
        x = torch.randint(-3, 4, (4, vocab), generator=g).float()  # ties in every row
        if trial % 3 == 0:
            x[torch.rand(4, vocab, generator=g) < 0.01] = math.nan
        if trial % 4 == 0:
            x[torch.rand(4, vocab, generator=g) < 0.02] = math.inf
        if trial % 5 == 0:
            x[1:3] = -math.inf
        if trial % 6 == 0:
            x[0, -1] = 10.0  # the maximum in the last column (a partial tail block)
        assert torch.equal(first_argmax(x, block), x.max(dim=-1).indices), (trial, x)


def test_greedy_picks_the_first_maximum_on_a_real_vocab():
    logits = rand_logits(3, vocab=49152)
    logits[0, [700, 40000]] = 100.0  # a tie: the lower index wins, as argmax's
    logits[1, 49151] = 100.0
    out = Sampler()(logits, [state(temperature=0.0) for _ in range(3)])
    assert out.token_ids == [700, 49151, int(logits[2].argmax())]


def test_logit_bias_adds_to_named_tokens_only():
    logits = rand_logits(2)
    expected = logits.clone()
    expected[0, 3] += 5.0
    expected[0, 7] -= 100.0
    expected[1, 7] += 0.5
    apply_logit_bias(logits, [state(logit_bias={3: 5.0, 7: -100.0}), state(logit_bias={7: 0.5})])
    torch.testing.assert_close(logits, expected)
    # a strong bias decides a greedy pick
    assert Sampler()(rand_logits(1), [state(temperature=0, logit_bias={11: 100.0})]).token_ids == [11]


def test_logit_bias_out_of_vocab_rejected():
    with pytest.raises(ValueError, match="token id 64 is out of range for vocab size 64"):
        apply_logit_bias(rand_logits(1), [state(logit_bias={64: 1.0})])


def test_min_tokens_masks_stop_ids_until_reached():
    logits = rand_logits(3)
    expected = logits.clone()
    states = [
        state(outputs=[5], min_tokens=3, stop_ids=[2, 9], stop_token_ids=[9, 13]),  # masked: 2, 9, 13
        state(outputs=[5, 6, 7], min_tokens=3, stop_ids=[2]),  # reached: untouched
        state(outputs=[], stop_ids=[2]),  # no min_tokens
    ]
    expected[0, [2, 9, 13]] = -math.inf
    apply_min_tokens(logits, states)
    assert torch.equal(logits, expected)
    # greedy would pick EOS, but min_tokens forbids it
    eos_heavy = torch.zeros(1, V)
    eos_heavy[0, 2] = 50.0
    eos_heavy[0, 4] = 1.0
    assert Sampler()(eos_heavy, [state(temperature=0, min_tokens=2, stop_ids=[2])]).token_ids == [4]


def reference_penalties(logits, prompt, outputs, presence, frequency, repetition):
    out = logits.clone()
    for tok in set(prompt) | set(outputs):
        x = out[tok].item()
        out[tok] = x / repetition if x > 0 else x * repetition
    for tok in set(outputs):
        out[tok] -= frequency * outputs.count(tok) + presence
    return out


def test_penalties_match_reference_formulas():
    logits = rand_logits(4)
    cases = [
        dict(prompt=[1, 2, 2, 40], outputs=[2, 5, 5, 5, 63], presence=0.5, frequency=0.3, repetition=1.3),
        dict(prompt=[7], outputs=[], presence=1.0, frequency=1.0, repetition=0.8),
        dict(prompt=[0, 1], outputs=[1, 1, 9], presence=-0.4, frequency=0.0, repetition=1.0),
        dict(prompt=[3, 4], outputs=[4, 8], presence=0.0, frequency=0.0, repetition=1.0),  # no penalty row
    ]
    states = [
        state(
            c["outputs"],
            c["prompt"],
            presence_penalty=c["presence"],
            frequency_penalty=c["frequency"],
            repetition_penalty=c["repetition"],
        )
        for c in cases
    ]
    got = logits.clone()
    apply_penalties_from_states(got, states)
    for i, c in enumerate(cases):
        torch.testing.assert_close(got[i], reference_penalties(logits[i], **c))
    assert torch.equal(got[3], logits[3])


def test_top_k_keeps_exactly_the_k_largest():
    logits = rand_logits(4)
    ks = torch.tensor([1, 5, V, 200])  # 200 > V behaves as off
    masked = apply_top_k_top_p(logits, ks, None)
    for row, k in enumerate([1, 5, V, V]):
        assert finite_set(masked[row]) == set(logits[row].topk(k).indices.tolist())
        keep = torch.isfinite(masked[row])
        assert torch.equal(masked[row][keep], logits[row][keep])


def reference_top_p(row: torch.Tensor, p: float) -> set[int]:
    probs = row.softmax(-1)
    order = probs.argsort(descending=True).tolist()
    kept, mass = set(), 0.0
    for tok in order:
        if probs[tok] == 0:  # already masked (-inf)
            break
        kept.add(tok)
        mass += probs[tok].item()
        if mass >= p:
            break
    return kept


@pytest.mark.parametrize("p", [0.05, 0.3, 0.75, 0.95])
def test_top_p_keeps_the_smallest_nucleus(p):
    logits = rand_logits(6, seed=int(p * 100))
    masked = apply_top_k_top_p(logits, None, torch.full((6,), p))
    for row in range(6):
        assert finite_set(masked[row]) == reference_top_p(logits[row], p)


def test_top_k_then_top_p_renormalises_within_top_k():
    logits = rand_logits(3, seed=3)
    masked = apply_top_k_top_p(logits, torch.tensor([10, 10, 10]), torch.tensor([0.5, 0.9, 1.0]))
    for row, p in enumerate([0.5, 0.9, 1.0]):
        top10 = logits[row].clone()
        top10[~torch.isin(torch.arange(V), logits[row].topk(10).indices)] = -math.inf
        assert finite_set(masked[row]) == reference_top_p(top10, p)


def test_top_k_top_p_mixed_rows_match_reference():
    logits = rand_logits(4, seed=8)
    top_k = torch.tensor([10, V, 3, V])  # V = off
    top_p = torch.tensor([0.6, 0.7, 1.0, 1.0])
    masked = apply_top_k_top_p(logits, top_k, top_p)
    for row in range(4):
        expected = logits[row].clone()
        k = int(top_k[row])
        expected[~torch.isin(torch.arange(V), logits[row].topk(k).indices)] = -math.inf
        assert finite_set(masked[row]) == reference_top_p(expected, float(top_p[row]))
    assert torch.equal(masked[3], logits[3])


def test_min_p_threshold_relative_to_top_probability():
    logits = rand_logits(3, seed=4)
    min_p = torch.tensor([0.0, 0.1, 0.5])
    masked = apply_min_p(logits, min_p)
    for row in range(3):
        probs = logits[row].softmax(-1)
        expected = {t for t in range(V) if probs[t] >= min_p[row] * probs.max()}
        assert finite_set(masked[row]) == expected


def empirical(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_temperature_sampling_matches_softmax_distribution(temperature):
    vocab, draws = 6, 20000
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    expected = (base / temperature).softmax(-1)
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        out = Sampler()(base.repeat(draws, 1), [state(temperature=temperature)] * draws)
    assert (empirical(torch.tensor(out.token_ids), vocab) - expected).abs().max() < 0.015
    # rows with their own generator follow the same distribution
    gen = make_generator(99, "cpu")
    out = Sampler()(base.repeat(2000, 1), [state(temperature=temperature, generator=gen)] * 2000)
    assert (empirical(torch.tensor(out.token_ids), vocab) - expected).abs().max() < 0.04


def test_exponential_race_respects_masked_tokens():
    probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]]).repeat(2000, 1)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        tokens = exponential_race(probs, [None] * 2000)
    assert set(tokens.tolist()) == {1, 2}


def run_steps(logits_per_step, states):
    """Sample a few steps, feeding each row's tokens back as its outputs."""
    sampler = Sampler()
    for logits in logits_per_step:
        out = sampler(logits[: len(states)], states)
        for s, tok in zip(states, out.token_ids, strict=True):
            s.output_token_ids.append(tok)
    return [s.output_token_ids for s in states]


def test_seeded_request_same_tokens_alone_or_in_a_batch_of_16():
    steps = [rand_logits(16, vocab=1000, seed=10 + i) * 0.2 for i in range(6)]
    params = dict(temperature=0.9, top_p=0.95, top_k=500, presence_penalty=0.2)

    alone = run_steps([s[:1] for s in steps], [state(generator=make_generator(42, "cpu"), **params)])[0]
    batch = [state(generator=make_generator(42, "cpu"), **params)]
    batch += [state(temperature=1.3) for _ in range(7)]  # unseeded random rows
    batch += [state(generator=make_generator(7 + i, "cpu"), min_p=0.05) for i in range(4)]
    batch += [state(temperature=0) for _ in range(4)]
    # place the seeded request in the middle of the batch, with its own logits row
    batch.insert(9, batch.pop(0))
    batch_steps = []
    for s in steps:
        rows = torch.cat([s[1:10], s[:1], s[10:]])
        batch_steps.append(rows)
    with torch.random.fork_rng():
        torch.manual_seed(999)
        in_batch = run_steps(batch_steps, batch)[9]
    assert in_batch == alone
    other_seed = run_steps([s[:1] for s in steps], [state(generator=make_generator(43, "cpu"), **params)])[0]
    assert other_seed != alone


def test_logprobs_are_raw_log_softmax_with_ranks_and_top_k():
    logits = rand_logits(3, seed=5)
    states = [
        state(temperature=0.7, logit_bias={0: 30.0}, logprobs=3, generator=make_generator(1, "cpu")),
        state(temperature=0, logprobs=0),
        state(temperature=0),
    ]
    out = Sampler()(logits, states)
    raw = torch.log_softmax(logits, -1)
    assert out.token_ids[0] == 0  # the bias decided the draw, but logprobs ignore it
    for row in (0, 1):
        tok = out.token_ids[row]
        assert out.logprobs[row] == pytest.approx(raw[row, tok].item(), abs=1e-6)
        assert out.ranks[row] == int((raw[row] > raw[row, tok]).sum()) + 1
    assert out.ranks[1] == 1
    top_values, top_ids = raw[0].topk(3)
    assert [t for t, _ in out.top_logprobs[0]] == top_ids.tolist()
    assert [lp for _, lp in out.top_logprobs[0]] == pytest.approx(top_values.tolist(), abs=1e-6)
    assert out.top_logprobs[1] == []
    assert (out.logprobs[2], out.ranks[2], out.top_logprobs[2]) == (None, None, None)


def test_prompt_logprobs_for_actual_next_tokens():
    logits = rand_logits(4, seed=6)
    targets = [5, 17, 0, 63]
    entries = prompt_logprobs_for(logits, targets, num_top=2, decode=lambda t: f"<{t}>")
    raw = torch.log_softmax(logits, -1)
    for row, (entry, tok) in enumerate(zip(entries, targets, strict=True)):
        first_id, first = next(iter(entry.items()))
        assert first_id == tok and first.decoded_token == f"<{tok}>"
        assert first.logprob == pytest.approx(raw[row, tok].item(), abs=1e-6)
        assert first.rank == int((raw[row] > raw[row, tok]).sum()) + 1
        top_ids = raw[row].topk(2).indices.tolist()
        assert set(entry) == {tok, *top_ids}
        assert [entry[t].rank for t in top_ids if t != tok] == [r + 1 for r, t in enumerate(top_ids) if t != tok]
    with pytest.raises(ValueError, match="P = 3"):
        prompt_logprobs_for(logits, [1, 2, 3], num_top=1)


def test_mismatched_batch_rejected():
    with pytest.raises(ValueError, match="N = len\\(states\\) = 2"):
        Sampler()(rand_logits(3), [state(), state()])
