"""Request bodies of the OpenAI-compatible API (pydantic), with OpenAI's and vLLM's field names.

Only the shapes live here; turning a request into :class:`~core.sampling_params.SamplingParams`
is :mod:`core.server.params`. Ranges the engine checks itself (temperature, top_p, ...) are
left to ``SamplingParams`` so there is one source of truth; bounds here only keep a request
from asking for unbounded work (``n``, ``logprobs``) or overflowing an int64 (``seed``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 128
INT64_MAX = 2**63 - 1
# seed + index (one generator per completion) must stay an int64
Seed = Annotated[int, Field(ge=-(2**63), le=INT64_MAX - MAX_N)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]


class _Request(BaseModel):
    # clients (the OpenAI SDK among them) send fields we have no use for: ignore, as vLLM does
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Request):
    include_usage: bool = False


class SamplingFields(_Request):
    """The sampling fields both generation endpoints share (vLLM's extra ones included)."""

    model: str | None = None
    n: Annotated[int, Field(le=MAX_N)] = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: prompt as text, texts, token ids or lists of token ids."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    suffix: str | None = None
    best_of: int | None = None


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    add_generation_prompt: bool = True
    chat_template: str | None = None
    tools: list[dict] | None = None
    response_format: dict | None = None


class TokenizeRequest(_Request):
    """``POST /tokenize``: a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True


class DetokenizeRequest(_Request):
    """``POST /detokenize``."""

    model: str | None = None
    tokens: list[TokenId]
