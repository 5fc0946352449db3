"""Per-request sampling settings, with vLLM's field names, defaults and validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from core.structured.params import StructuredOutputsParams

# Below this a temperature is treated as zero (greedy), as in vLLM.
SAMPLING_EPS = 1e-5
MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0


@dataclass
class SamplingParams:
    """How to sample the completion(s) of one request.

    Field names and defaults follow vLLM's ``SamplingParams``. ``stop`` and
    ``stop_token_ids`` are normalised to lists after construction. ``top_k`` of 0 or
    -1 means "off". ``max_tokens=None`` means "up to the model length"; the engine
    fills it in. Invalid values raise ``ValueError`` naming the field, the value and the
    valid range.
    """

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if self.stop is not None else []
        self.stop_token_ids = list(self.stop_token_ids) if self.stop_token_ids is not None else []
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        self._validate()

    def _validate(self) -> None:
        _check_int("n", self.n, low=1)
        _check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_number("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        _check_number("temperature", self.temperature)
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        _check_number("top_p", self.top_p)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        _check_int("top_k", self.top_k, low=-1)
        _check_range("min_p", self.min_p, 0.0, 1.0)
        if self.seed is not None:
            _check_int("seed", self.seed)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, low=1)
        _check_int("min_tokens", self.min_tokens, low=0)
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens ({self.max_tokens}), got {self.min_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, low=0, high=MAX_LOGPROBS)
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop must hold non-empty strings, got {s!r}")
        for tid in self.stop_token_ids:
            _check_int("stop_token_ids[]", tid, low=0)
        for tid, bias in (self.logit_bias or {}).items():
            if tid < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {tid}")
            _check_range(f"logit_bias[{tid}]", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
        if self.structured_outputs is not None and not isinstance(self.structured_outputs, StructuredOutputsParams):
            raise ValueError(
                f"structured_outputs must be a StructuredOutputsParams, got {type(self.structured_outputs).__name__}"
            )

    @property
    def is_greedy(self) -> bool:
        """True when sampling reduces to argmax (temperature 0 or top_k 1)."""
        return self.temperature < SAMPLING_EPS or self.top_k == 1

    @property
    def is_top_k_enabled(self) -> bool:
        """True when top_k restricts the candidates (0 and -1 mean off)."""
        return self.top_k > 0

    @property
    def has_penalties(self) -> bool:
        """True when any repetition/presence/frequency penalty is active."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    def stop_ids_for(self, eos_token_ids: list[int] | tuple[int, ...]) -> list[int]:
        """The token ids that end this request: ``stop_token_ids`` plus EOS unless ignored."""
        ids = list(self.stop_token_ids or [])
        if not self.ignore_eos:
            ids.extend(t for t in eos_token_ids if t not in ids)
        return ids

    def clone(self, **changes: object) -> SamplingParams:
        """A validated copy with ``changes`` applied (e.g. ``max_tokens`` filled in)."""
        return replace(self, **changes)


def _check_number(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{name} must be a number, got {value!r}")


def _check_range(name: str, value: object, low: float, high: float) -> None:
    _check_number(name, value)
    if not low <= value <= high:  # type: ignore[operator]
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")


def _check_int(name: str, value: object, low: int | None = None, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
