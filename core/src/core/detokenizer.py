"""Incremental detokenization and stop handling for one generated sequence.

``IncrementalDetokenizer`` turns each new token into a text delta with the
prefix/read-offset technique: it decodes only a short window of recent tokens, twice
(without and with the new ones), and emits the difference. This keeps the cost per
token constant, gets sentencepiece's leading-space tokens right (the window carries
left context) and never splits a multi-byte character: while the window's text ends
in U+FFFD (an incomplete UTF-8 sequence from byte-level tokens) nothing is emitted.

``StopChecker`` finds stop strings (also across token boundaries), cuts the text at
them and says which text may be streamed: the tail that could still grow into a stop
string is held back, so a stop string never leaks into a streamed delta. EOS, stop
token ids and max_tokens are the request state's business (token ids, not text).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Tokens of prompt context decoded with the first output token (vLLM uses 5 too).
INITIAL_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a sequence's output tokens, one at a time, into text deltas.

    :param tokenizer: a Hugging Face tokenizer (anything with ``decode(ids, ...)``).
    :param prompt_token_ids: the prompt; its last few tokens give the first output
        token its left context (a leading-space token decodes as " word", not "word").
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.token_ids: list[int] = list(prompt_token_ids)
        self.num_prompt_tokens = len(self.token_ids)
        self.output_text = ""
        self._decode_kwargs = {
            "skip_special_tokens": skip_special_tokens,
            "spaces_between_special_tokens": spaces_between_special_tokens,
            "clean_up_tokenization_spaces": False,
        }
        self._read_offset = len(self.token_ids)
        self._prefix_offset = max(self._read_offset - INITIAL_CONTEXT_TOKENS, 0)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)

    @property
    def output_token_ids(self) -> list[int]:
        """The tokens added so far (after the prompt)."""
        return self.token_ids[self.num_prompt_tokens :]

    def add(self, token_id: int) -> str:
        """Append one token; return the newly complete text ("" while a character is partial)."""
        self.token_ids.append(token_id)
        new_text = self._decode(self._prefix_offset, len(self.token_ids))
        if len(new_text) <= len(self._prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = new_text[len(self._prefix_text) :]
        # the window slides: what was read becomes the prefix of the next decode
        self._prefix_offset = self._read_offset
        self._read_offset = len(self.token_ids)
        self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        self.output_text += delta
        return delta

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self.tokenizer.decode(self.token_ids[start:end], **self._decode_kwargs)


class StopChecker:
    """Finds stop strings in a sequence's growing text and says what may be streamed.

    Stop strings are found also when split across tokens (a match may start in
    earlier text as long as it ends in the new delta). The output is cut before the
    stop string, or after it with ``include_stop_str_in_output``. Stop strings do not
    count before ``min_tokens`` tokens have been generated (as in vLLM).
    """

    def __init__(
        self,
        stop: Sequence[str],
        include_stop_str_in_output: bool = False,
        min_tokens: int = 0,
    ) -> None:
        if any(not s for s in stop):
            raise ValueError(f"stop strings must be non-empty, got {list(stop)!r}")
        self.stop = list(stop)
        self.include_stop_str_in_output = include_stop_str_in_output
        self.min_tokens = min_tokens

    def check(self, text: str, delta: str, num_output_tokens: int) -> tuple[str, str | None]:
        """Append ``delta`` to ``text``; return the new text and the stop string that ended it.

        When a stop string matched (None otherwise), the returned text is already cut
        and the sequence should finish with ``stop_reason`` = that string.
        """
        new_text = text + delta
        if num_output_tokens < self.min_tokens:
            return new_text, None
        best: tuple[int, str] | None = None
        for stop in self.stop:
            # the match must end inside the delta, so it starts at most len(stop)-1 before it
            index = new_text.find(stop, max(0, len(text) - len(stop) + 1))
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return new_text, None
        index, stop = best
        end = index + len(stop) if self.include_stop_str_in_output else index
        return new_text[:end], stop

    def visible(self, text: str) -> str:
        """The part of an unfinished sequence's ``text`` that may be streamed now.

        Holds back the longest tail that is a proper prefix of a stop string: it may
        still become one, and a stop string must never reach the client. What is
        visible now stays a prefix of what is visible later.
        """
        return text[: len(text) - self._partial_stop_len(text)]

    def _partial_stop_len(self, text: str) -> int:
        longest = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
