"""Reasoning parsers: <think> text split from the answer, whole and streamed."""

from __future__ import annotations

import pytest
from core.server.reasoning import ReasoningStream, get_reasoning_parser


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
