"""N-gram (prompt lookup) proposals: the tokens that followed the sequence's suffix earlier on."""

from __future__ import annotations

from array import array

_WIDTH = 4  # bytes of one token id in the searched buffer (int32: every vocabulary fits)


def find_ngram(token_ids: list[int], min_n: int, max_n: int, source: int = -1) -> tuple[int, int]:
    """``(n, start)``: the longest suffix of ``token_ids`` of ``max_n`` down to ``min_n`` tokens
    that occurred earlier (before the suffix itself), and where the tokens after that occurrence
    start; ``(0, -1)`` when no such suffix recurs.

    Of the suffix's occurrences, the one whose continuation starts first at or after ``source``
    (where the sequence's last drafts came from, past those accepted: after the model changed a
    word of the text it copies, the copy resumes there, not at the suffix's latest occurrence);
    the latest occurrence when ``source`` is negative or none lies at or after it.
    The prompt and the generated tokens are one sequence here, so a match may lie in either.
    The search runs on the ids' bytes (``bytes.rfind``, C speed); a hit that is not aligned
    to a token boundary is skipped.
    """
    length = len(token_ids)
    if length < min_n + 1:
        return 0, -1
    data = array("i", token_ids).tobytes()
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = data[(length - n) * _WIDTH :]
        end = (length - 1) * _WIDTH  # a match must end before the last token: one token follows it
        found = -1
        while True:
            hit = data.rfind(suffix, 0, end)
            if hit < 0:
                break
            end = hit + len(suffix) - 1
            if hit % _WIDTH:
                continue
            start = hit // _WIDTH + n
            if found < 0 or start >= source:  # latest first, then back towards the source
                found = start
            if start <= source or source < 0:
                break
        if found >= 0:
            return n, found
    return 0, -1


def propose_ngram(token_ids: list[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` drafts for ``token_ids``: the tokens after the match
    :func:`find_ngram` finds; empty when no suffix recurs."""
    if num_tokens < 1:
        return []
    n, start = find_ngram(token_ids, min_n, max_n)
    return token_ids[start : start + num_tokens] if n else []
