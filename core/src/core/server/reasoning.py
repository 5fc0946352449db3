"""Reasoning parsers (``core serve --reasoning-parser NAME``): a thinking model's ``<think>`` text
goes to the message's ``reasoning`` (and ``reasoning_content``) field, the rest stays content.

``deepseek_r1``: everything before ``</think>`` is reasoning (the template opens the block in the
prompt; a leading ``<think>`` is dropped), and an answer that never closes it is all reasoning.
``qwen3``: only an answer that closes a ``<think>`` block has reasoning; one without is all content.
"""

from __future__ import annotations

from dataclasses import dataclass

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    """How one model family marks its reasoning."""

    name: str
    #: whether an answer with no ``</think>`` is reasoning (else content)
    unclosed_is_reasoning: bool

    def split(self, text: str, is_finished: bool = True) -> tuple[str | None, str]:
        """``(reasoning, content)`` of the answer so far; while unfinished, a tail that could
        still become ``</think>`` is in neither."""
        if not is_finished and START.startswith(text):
            return None, ""  # the answer may be opening a block
        body = text.removeprefix(START) if text.startswith(START) else text
        end = body.find(END)
        if end >= 0:
            return body[:end].strip("\n") or None, body[end + len(END) :].lstrip("\n")
        if not is_finished:
            held = next((k for k in range(len(END) - 1, 0, -1) if body.endswith(END[:k])), 0)
            body = body[: len(body) - held]
            if text.startswith(START) or self.unclosed_is_reasoning:
                return body.strip("\n") or None, ""  # newlines that may yet end the block wait
            return None, body
        return (body.strip("\n") or None, "") if self.unclosed_is_reasoning else (None, text)


PARSERS = {"deepseek_r1": ReasoningParser("deepseek_r1", True), "qwen3": ReasoningParser("qwen3", False)}


def get_reasoning_parser(name: str) -> ReasoningParser:
    """The parser ``name``; ``ValueError`` naming the known ones."""
    if name not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(PARSERS)}")
    return PARSERS[name]


@dataclass
class ReasoningStream:
    """One streamed choice's reasoning: how much has gone out."""

    parser: ReasoningParser | None
    num_reasoning: int = 0

    def advance(self, text: str, is_finished: bool) -> tuple[str, str]:
        """``(reasoning delta, content so far)``."""
        if self.parser is None:
            return "", text
        reasoning, content = self.parser.split(text, is_finished)
        reasoning = reasoning or ""
        delta = reasoning[self.num_reasoning :]
        self.num_reasoning = max(self.num_reasoning, len(reasoning))
        return delta, content
