"""``--speculative-config``: vLLM's keys, checked once, before the engine is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: the proposal methods this engine has (vLLM's names)
METHODS = ("ngram", "draft_model")
#: vLLM's default n-gram length when neither bound is given
DEFAULT_LOOKUP = 5
#: the keys each method takes besides ``method`` and ``num_speculative_tokens``
METHOD_KEYS = {"ngram": ("prompt_lookup_min", "prompt_lookup_max"), "draft_model": ("model",)}


@dataclass(frozen=True)
class SpeculativeConfig:
    """How sequences speculate: ``method`` proposes up to ``num_speculative_tokens`` drafts a step.

    For ``ngram``: the longest suffix of ``prompt_lookup_min .. prompt_lookup_max`` tokens
    that occurred earlier in the sequence is matched, and the tokens after that occurrence
    are the drafts. For ``draft_model``: ``model`` (a path or name, as the engine's own
    ``model``) is a smaller model with the target's vocabulary that proposes them, one
    forward pass each (:class:`core.spec_decode.draft_model.DraftModel`).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 0
    prompt_lookup_max: int = 0
    model: str | None = None

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> SpeculativeConfig:
        """Check vLLM's ``speculative_config`` keys and settle the defaults.

        :raises ValueError: an unknown method or key, ``num_speculative_tokens`` < 1, bad
            n-gram bounds or a draft model that is not named; the message names the key and
            the valid choices.
        """
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {config!r}")
        method = config.get("method")
        if method not in METHODS:
            raise ValueError(f"speculative_config: method must be one of {', '.join(METHODS)}, got {method!r}")
        known = {"method", "num_speculative_tokens", *METHOD_KEYS[method]}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(unknown)} for method {method}; "
                f"known: {', '.join(sorted(known))}"
            )
        k = config.get("num_speculative_tokens")
        if not _is_int(k) or k < 1:
            raise ValueError(f"speculative_config: num_speculative_tokens must be an integer >= 1, got {k!r}")
        if method == "draft_model":
            model = config.get("model")
            if not isinstance(model, str) or not model:
                raise ValueError(f"speculative_config: method draft_model needs model (a path or name), got {model!r}")
            return cls(method, k, model=model)
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
