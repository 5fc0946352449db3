"""Incremental detokenization and stop handling for one generated sequence.

``IncrementalDetokenizer`` turns each new token into a text delta with the
prefix/read-offset technique: it decodes only a short window of recent tokens, twice
(without and with the new ones), and emits the difference. This keeps the cost per
token constant, gets sentencepiece's leading-space tokens right (the window carries
left context) and never splits a multi-byte character: while the window's text ends
in U+FFFD (an incomplete UTF-8 sequence from byte-level tokens) nothing is emitted.

``StopChecker`` decides when a sequence ends (EOS, stop token ids, stop strings,
max_tokens) and which text may be streamed: the tail that could still grow into a
stop string is held back, so a stop string never leaks into a streamed delta.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.outputs import FinishReason
from core.sampling_params import SamplingParams

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
    """Tracks one sequence's text and decides when it finishes and what may stream.

    Feed it every generated token with the detokenizer's delta (``update``). It ends
    the sequence on EOS (unless ``ignore_eos``), a stop token id, a stop string (also
    one split across tokens) or ``max_tokens``; none of the first three count before
    ``min_tokens``. The text of a stop token or string is dropped from the output
    unless ``include_stop_str_in_output``.

    :param max_tokens: overrides ``params.max_tokens`` (e.g. the engine's fill-in for
        None); None means no length limit here.
    """

    def __init__(
        self,
        params: SamplingParams,
        eos_token_ids: Sequence[int] = (),
        max_tokens: int | None = None,
    ) -> None:
        self.stop_strings: list[str] = list(params.stop or [])
        self.stop_token_ids = set(params.stop_token_ids or [])
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.include_stop_str_in_output = params.include_stop_str_in_output
        self.min_tokens = params.min_tokens
        self.max_tokens = max_tokens if max_tokens is not None else params.max_tokens
        self.text = ""
        self.num_output_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: str | int | None = None
        self._num_emitted = 0

    @property
    def is_finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None

    def update(self, token_id: int, delta: str) -> str:
        """Record one generated token and its text delta; return the text that may stream now.

        After this returns, ``finish_reason`` / ``stop_reason`` say whether the sequence
        ended, and ``text`` is its (truncated) output text so far.
        """
        if self.is_finished:
            raise RuntimeError(f"update() after the sequence finished ({self.finish_reason})")
        self.num_output_tokens += 1
        may_stop = self.num_output_tokens >= self.min_tokens
        if may_stop and (token_id in self.eos_token_ids or token_id in self.stop_token_ids):
            if self.include_stop_str_in_output:
                self.text += delta
            is_eos = token_id in self.eos_token_ids and token_id not in self.stop_token_ids
            return self.force_finish("stop", None if is_eos else token_id)
        old_len = len(self.text)
        self.text += delta
        if may_stop and self.stop_strings and self._truncate_at_stop_string(old_len):
            return self._release(len(self.text))
        if self.max_tokens is not None and self.num_output_tokens >= self.max_tokens:
            return self.force_finish("length")
        return self._release(len(self.text) - self._partial_stop_len())

    def force_finish(self, finish_reason: FinishReason, stop_reason: str | int | None = None) -> str:
        """End the sequence now (e.g. abort, model length); return the held-back text."""
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        return self._release(len(self.text))

    def _truncate_at_stop_string(self, old_len: int) -> bool:
        """Find the earliest stop string that ends in the new text; cut the text there."""
        best: tuple[int, str] | None = None
        for stop in self.stop_strings:
            # a match must end in the new text, so it starts at most len(stop)-1 before it
            index = self.text.find(stop, max(0, old_len - len(stop) + 1))
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return False
        index, stop = best
        self.text = self.text[: index + len(stop) if self.include_stop_str_in_output else index]
        self.finish_reason = "stop"
        self.stop_reason = stop
        return True

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stop_strings:
            for length in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _release(self, end: int) -> str:
        if end <= self._num_emitted:
            return ""
        out = self.text[self._num_emitted : end]
        self._num_emitted = end
        return out
