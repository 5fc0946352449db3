"""``--speculative-config``: vLLM's keys, checked once, before the engine is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the proposal methods this engine has (vLLM's names)
METHODS = ("ngram",)
#: vLLM's default n-gram length when neither bound is given
DEFAULT_LOOKUP = 5


@dataclass(frozen=True)
class SpeculativeConfig:
    """How sequences speculate: ``method`` proposes up to ``num_speculative_tokens`` drafts a step.

    For ``ngram``: the longest suffix of ``prompt_lookup_min .. prompt_lookup_max`` tokens
    that occurred earlier in the sequence is matched, and the tokens after that occurrence
    are the drafts.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> SpeculativeConfig:
        """Check vLLM's ``speculative_config`` keys and settle the defaults.

        :raises ValueError: an unknown method or key, ``num_speculative_tokens`` < 1, or bad
            n-gram bounds; the message names the key and the valid choices.
        """
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {config!r}")
        known = {"method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max"}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {', '.join(METHODS)}, got {method!r}")
        k = config.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        lo, hi = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if lo is None and hi is None:  # vLLM's defaults: one bound settles the other
            lo = hi = DEFAULT_LOOKUP
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if not _is_int(value) or value < 1:
                raise ValueError(f"speculative_config: {name} must be an integer >= 1, got {value!r}")
        if lo > hi:
            raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
        return cls(method, k, lo, hi)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
