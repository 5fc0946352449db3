"""Texts to a pooling model's token ids, truncated as sentence-transformers truncates them.

The encoded content is cut here, around the tokenizer's special tokens, rather than by asking the
tokenizer to truncate: that sets a truncation state on a fast tokenizer, which other threads
encoding at the same moment would trip over.
"""

from __future__ import annotations

from typing import Any


def encode_text(tokenizer: Any, text: str, max_tokens: int | None = None) -> list[int]:
    """``text``'s token ids with the special tokens; at most ``max_tokens`` (the content cut at its end)."""
    return _encode(tokenizer, [text], max_tokens)


def encode_pair(tokenizer: Any, first: str, second: str, max_tokens: int | None = None) -> list[int]:
    """A pair's token ids (BERT: ``[CLS] first [SEP] second [SEP]``); at most ``max_tokens``, a token
    at a time cut from the end of the longer text (the tokenizers' ``longest_first``)."""
    return _encode(tokenizer, [first, second], max_tokens)


def _encode(tokenizer: Any, texts: list[str], max_tokens: int | None) -> list[int]:
    encoding = tokenizer(*texts)
    ids = encoding["input_ids"]
    if max_tokens is None or len(ids) <= max_tokens:
        return ids
    owners = encoding.sequence_ids()  # None for a special token, else which text it is from
    lengths = [owners.count(i) for i in range(len(texts))]
    budget = max(0, sum(lengths) - (len(ids) - max_tokens))
    keep = [budget]
    if len(texts) == 2:  # longest_first: the shorter text (the first of equals) keeps up to half
        shorter = 0 if lengths[0] <= lengths[1] else 1
        keep = [0, 0]
        keep[shorter] = min(lengths[shorter], budget // 2)
        keep[1 - shorter] = budget - keep[shorter]
    seen = [0] * len(texts)
    kept = []
    for token, owner in zip(ids, owners, strict=True):
        if owner is None or seen[owner] < keep[owner]:
            kept.append(token)
        if owner is not None:
            seen[owner] += 1
    return kept
