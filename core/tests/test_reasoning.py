"""Reasoning parsers: <think> text split from the answer, whole and streamed."""

from __future__ import annotations

import pytest
from core.structured.reasoning import ReasoningStream, get_reasoning_parser


@pytest.mark.parametrize(
    ("parser", "text", "reasoning", "content"),
    [
        ("deepseek_r1", "Let me think.\n</think>\n\nParis.", "Let me think.", "Paris."),
        ("deepseek_r1", "<think>Hmm</think>Paris.", "Hmm", "Paris."),
        ("deepseek_r1", "Still thinking", "Still thinking", ""),
        ("qwen3", "<think>\nHmm\n</think>\n\nParis.", "Hmm", "Paris."),
        ("qwen3", "Paris.", None, "Paris."),
    ],
    ids=["r1 closed", "r1 opened in the answer", "r1 unclosed", "qwen3 block", "qwen3 no block"],
)
def test_split(parser, text, reasoning, content):
    assert get_reasoning_parser(parser).split(text) == (reasoning, content)


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_streamed_deltas_join_to_the_whole(parser):
    text = "<think>\nThe capital... is Paris.\n</think>\n\nParis."
    stream = ReasoningStream(get_reasoning_parser(parser))
    thoughts, contents = [], []
    for end in range(1, len(text) + 1):
        thought, content = stream.advance(text[:end], is_finished=end == len(text))
        thoughts.append(thought)
        contents.append(content)
        assert "</" not in thought and "<think" not in content  # a partial tag is never sent
    assert "".join(thoughts) == "The capital... is Paris." and contents[-1] == "Paris."
    assert all(c == "" for c in contents[: text.index("</think>")])


def test_unknown_parser():
    with pytest.raises(ValueError, match="deepseek_r1, qwen3"):
        get_reasoning_parser("o1")


def test_every_declared_parser_exists():
    from plugins.config import REASONING_PARSERS

    assert [get_reasoning_parser(name).name for name in REASONING_PARSERS] == list(REASONING_PARSERS)


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_a_constraint_applies_after_the_reasoning(parser):
    """The gate allows any token inside <think>...</think>, then the schema's tokens only."""
    import torch
    from core.loader import default_model_path
    from core.loader.gguf_model import gguf_tokenizer
    from core.structured import StructuredOutputs, StructuredOutputsParams

    tokenizer = gguf_tokenizer(default_model_path(), None)
    structured = StructuredOutputs("guidance", tokenizer, len(tokenizer), [tokenizer.eos_token_id], parser)
    spec = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def allowed(matcher) -> int:
        bitmask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
        matcher.fill_bitmask(bitmask, 0)
        return int(sum(bin(w & 0xFFFFFFFF).count("1") for w in bitmask[0].tolist()))

    matcher = structured.matcher(spec)
    assert allowed(matcher) >= len(tokenizer)  # reasoning: anything
    thought = ("<think>" if parser == "qwen3" else "") + "Let me think: not JSON at all.</think>"
    assert all(matcher.accept(t) for t in encode(thought))
    assert allowed(matcher) < 100  # the schema now: '{' and a few
    assert all(matcher.accept(t) for t in encode('{"a":1}')) and matcher.accept(tokenizer.eos_token_id)
    assert matcher.is_terminated()
    if parser == "qwen3":  # an answer that opens no block is constrained from its first token
        plain = structured.matcher(spec)
        assert not plain.accept(encode("Sure")[0])
