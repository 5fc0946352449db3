"""Reasoning parsers (``--reasoning-parser NAME``): a thinking model's ``<think>`` text goes to
the chat message's ``reasoning`` (and ``reasoning_content``) field, the rest stays content, and a
structured outputs constraint applies only to the rest (:class:`ReasoningGate`).

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


class ReasoningGate:
    """A sequence's grammar matcher that lets its reasoning through unconstrained.

    While the answer is inside its ``<think>`` block every token is allowed and the inner
    matcher sees none of them; from the token that closes the block on, the inner matcher
    constrains and advances as usual. ``deepseek_r1`` answers start inside the block;
    ``qwen3`` answers only when their first token opens one.

    :param inner: the constraint's matcher (:class:`core.structured.backends.Matcher`).
    :param start_ids: the token ids of ``<think>``; ``end_ids``: of ``</think>``.
    """

    def __init__(self, inner, parser: ReasoningParser, start_ids: list[int], end_ids: list[int]) -> None:
        self.inner = inner
        self.start_ids = start_ids
        self.end_ids = end_ids
        self.is_thinking: bool | None = True if parser.unclosed_is_reasoning else None  # None: not yet known
        self._recent: list[int] = []

    def fill_bitmask(self, bitmask, row: int) -> None:
        if self.is_thinking is False:
            self.inner.fill_bitmask(bitmask, row)
        else:
            bitmask[row].fill_(-1)  # every bit set: any token

    def accept(self, token_id: int) -> bool:
        if self.is_thinking is None:  # the first token says whether a block opens
            self.is_thinking = token_id == self.start_ids[0]
            if self.is_thinking:
                return True
        if not self.is_thinking:
            return self.inner.accept(token_id)
        self._recent = (self._recent + [token_id])[-len(self.end_ids) :]
        if self._recent == self.end_ids:
            self.is_thinking = False
        return True

    def is_terminated(self) -> bool:
        return self.is_thinking is False and self.inner.is_terminated()

    @property
    def can_rollback(self) -> bool:
        """Once the reasoning is over: every token since went to the inner matcher, which rolls back."""
        return self.is_thinking is False and self.inner.can_rollback

    def validate(self, token_ids: list[int]) -> int:
        return self.inner.validate(token_ids)

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)
