"""Structured outputs on the default model (SmolLM2-135M-Instruct GGUF), with both grammar backends.

Every constrained answer, sampled at temperature > 0 with several seeds, parses and validates
against its schema and ends with ``stop``; regex, choice and grammar answers match in full;
unconstrained requests batched with constrained ones keep their greedy tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import torch

from core import LLM, SamplingParams, StructuredOutputsParams

SCHEMAS = json.loads((Path(__file__).parent / "data" / "json_schemas.json").read_text())
SEEDS = (1, 2)


@pytest.fixture(scope="module", params=["guidance", "xgrammar"])
def llm(request):
    engine = LLM(
        max_model_len=1024, max_num_seqs=64, kv_cache_bytes=256 << 20, structured_outputs_backend=request.param
    )
    yield engine
    bm = engine.engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "KV blocks leaked"


def _chat(llm, text: str) -> str:
    return llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )


def _params(**structured) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=200, structured_outputs=StructuredOutputsParams(**structured))


def test_sampled_json_validates_against_its_schema(llm):
    prompts, params = [], []
    for case in SCHEMAS:
        for seed in SEEDS:
            prompts.append(_chat(llm, case["prompt"]))
            spec = StructuredOutputsParams(json=case["schema"])
            params.append(SamplingParams(temperature=0.9, seed=seed, n=2, max_tokens=200, structured_outputs=spec))
    outs = llm.generate(prompts, params, use_tqdm=False)
    for i, out in enumerate(outs):
        case = SCHEMAS[i // len(SEEDS)]
        for c in out.outputs:
            assert c.finish_reason == "stop", (case["name"], c.text)
            jsonschema.validate(json.loads(c.text), case["schema"])  # raises naming the broken rule


def test_json_is_compact(llm):
    (out,) = llm.generate([_chat(llm, "A person as JSON.")], _params(json=SCHEMAS[0]["schema"]), use_tqdm=False)
    assert "\n" not in out.outputs[0].text and "  " not in out.outputs[0].text


def test_regex_choice_and_grammar_match_in_full(llm):
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    cases = [
        (_params(regex=r"[A-Z][a-z]{2,8} [0-9]{2}"), lambda t: re.fullmatch(r"[A-Z][a-z]{2,8} [0-9]{2}", t)),
        (_params(choice=["Paris", "Rome", "Berlin"]), lambda t: t in ("Paris", "Rome", "Berlin")),
        (_params(grammar=grammar), lambda t: re.fullmatch(r"The answer is (yes|no)\.", t)),
        (_params(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    ]
    prompt = _chat(llm, "What is the capital of France?")
    outs = llm.generate([prompt] * len(cases), [p for p, _ in cases], use_tqdm=False)
    for out, (_, matches) in zip(outs, cases, strict=True):
        assert matches(out.outputs[0].text) and out.outputs[0].finish_reason == "stop", out.outputs[0].text


def test_unconstrained_rows_keep_their_greedy_tokens_beside_constrained_ones(llm):
    prompts = [_chat(llm, "What is the capital of France?"), _chat(llm, "Name three colors.")]
    free = SamplingParams(temperature=0, max_tokens=24)
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free, use_tqdm=False)]
    mixed_prompts = prompts + [_chat(llm, case["prompt"]) for case in SCHEMAS[:4]]
    mixed_params = [free, free] + [_params(json=case["schema"]) for case in SCHEMAS[:4]]
    mixed = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:2]] == alone


def test_the_mask_filled_during_the_forward_is_each_matchers_own(llm, monkeypatch):
    """The engine fills a step's bitmask on a worker thread while the forward runs (in one call
    for llguidance's matchers): each row is what its matcher fills alone, after the forward."""
    engine, steps = llm.engine, []
    sample = engine._sample

    def checking(logits, entries, outputs=None, early_mask=None, draft_runs=None, runs=None):
        matchers = [c.matcher for _, c in entries]
        assert early_mask is not None and all(a is b for a, b in zip(early_mask[0], matchers, strict=True))
        assert early_mask[1] == (runs or {}) == {}  # no speculative runs
        bitmask, rows = early_mask[2]
        alone = torch.zeros_like(bitmask)
        for j, i in enumerate(rows):
            matchers[i].fill_bitmask(alone, j)
        assert rows == list(range(len(matchers))) and torch.equal(bitmask, alone)
        steps.append(len(rows))
        return sample(logits, entries, outputs, early_mask, draft_runs, runs)

    monkeypatch.setattr(engine, "_sample", checking)
    cases = SCHEMAS[:6]
    outs = llm.generate([_chat(llm, c["prompt"]) for c in cases], [_params(json=c["schema"]) for c in cases],
                        use_tqdm=False)  # fmt: skip
    assert max(steps) == len(cases) and len(steps) >= max(len(o.outputs[0].token_ids) for o in outs)


@pytest.mark.parametrize(
    ("structured", "words"),
    [
        ({"regex": "(unclosed"}, "regex"),
        ({"json": {"type": "object", "not": {"required": ["a"]}}}, "not"),
        ({"grammar": "root ::= undefined_rule"}, "grammar"),
    ],
    ids=["bad regex", "unenforced keyword", "undefined rule"],
)
def test_a_bad_constraint_is_a_value_error_naming_it(llm, structured, words):
    with pytest.raises(ValueError, match=words):
        llm.generate(["Hi"], _params(**structured), use_tqdm=False)
    assert not llm.engine.requests  # nothing was left behind


def test_structural_tag_constrains_only_what_is_between_its_tags(llm):
    """vLLM's structural tag: free text, and a schema between begin and end once a trigger starts it."""
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<function=f>", "schema": {"type": "object", "properties": {"a": {"type": "integer"}},
                        "required": ["a"], "additionalProperties": False}, "end": "</function>"}],
        "triggers": ["<function="],
    }  # fmt: skip
    spec = StructuredOutputsParams(structural_tag=tag)
    structured, tokenizer = llm.engine.structured, llm.get_tokenizer()
    if structured._get_backend().name != "xgrammar":
        with pytest.raises(ValueError, match="xgrammar"):
            structured.compile(spec)
        return

    def accepts(text: str) -> bool:
        matcher = structured.matcher(spec)
        return all(matcher.accept(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts('Sure: <function=f>{"a": 1}</function> done')
    assert not accepts('Sure: <function=f>{"b": 1}</function>')
