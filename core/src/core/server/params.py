"""From an API request to :class:`~core.sampling_params.SamplingParams`.

Fields the client left out keep the engine's defaults; range checks are the engine's
(``SamplingParams`` raises ``ValueError``, which the server answers with 400).
"""

from __future__ import annotations

from typing import Any

from core.sampling_params import SamplingParams
from core.server.errors import bad_request
from core.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from core.structured import StructuredOutputsParams

_OPTIONAL = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
_ALWAYS = (
    "n",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "include_stop_str_in_output",
    "prompt_logprobs",
)


def _logit_bias(raw: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    if raw is None:
        return None
    bias = {}
    for key, value in raw.items():
        try:
            token_id = int(key)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {key!r}", "logit_bias") from None
        if not 0 <= token_id < vocab_size:
            raise bad_request(
                f"logit_bias token id {token_id} is outside the vocabulary [0, {vocab_size})", "logit_bias"
            )
        bias[token_id] = value
    return bias


def _structured(req: SamplingFields) -> StructuredOutputsParams | None:
    """The request's output constraint: ``response_format`` (OpenAI's) or ``structured_outputs`` (vLLM's)."""
    response_format = req.response_format
    if response_format is not None and response_format.type == "text":
        response_format = None
    if response_format is not None and req.structured_outputs is not None:
        raise bad_request("send response_format or structured_outputs, not both", "structured_outputs")
    try:
        if req.structured_outputs is not None:
            return StructuredOutputsParams.from_dict(req.structured_outputs)
    except (TypeError, ValueError) as exc:
        raise bad_request(str(exc), "structured_outputs") from None
    if response_format is None:
        return None
    if response_format.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if response_format.json_schema is None or response_format.json_schema.json_schema is None:
        raise bad_request("response_format json_schema needs json_schema.schema", "response_format.json_schema")
    return StructuredOutputsParams(json=response_format.json_schema.json_schema)


def _common(req: SamplingFields, vocab_size: int) -> dict[str, Any]:
    kwargs: dict[str, Any] = {name: getattr(req, name) for name in _ALWAYS}
    kwargs.update({name: getattr(req, name) for name in _OPTIONAL if getattr(req, name) is not None})
    for tid in req.stop_token_ids or ():
        if tid >= vocab_size:
            raise bad_request(f"stop_token_ids holds {tid}, outside the vocabulary [0, {vocab_size})", "stop_token_ids")
    kwargs["logit_bias"] = _logit_bias(req.logit_bias, vocab_size)
    kwargs["structured_outputs"] = _structured(req)
    return kwargs


def completion_params(req: CompletionRequest, vocab_size: int) -> SamplingParams:
    """SamplingParams of a ``/v1/completions`` request (``echo`` with logprobs asks for prompt logprobs)."""
    if req.suffix is not None:
        raise bad_request("suffix is not supported (no fill-in-the-middle): leave it out", "suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise bad_request("best_of is not supported: leave it out or set it equal to n", "best_of")
    kwargs = _common(req, vocab_size)
    kwargs["max_tokens"] = req.max_tokens
    kwargs["logprobs"] = req.logprobs
    if req.echo and req.logprobs is not None:
        kwargs["prompt_logprobs"] = max(req.logprobs, req.prompt_logprobs or 0)
    return SamplingParams(**kwargs)


def chat_params(req: ChatCompletionRequest, vocab_size: int) -> SamplingParams:
    """SamplingParams of a ``/v1/chat/completions`` request."""
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    kwargs = _common(req, vocab_size)
    kwargs["max_tokens"] = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    kwargs["logprobs"] = (req.top_logprobs or 0) if req.logprobs else None
    return SamplingParams(**kwargs)
