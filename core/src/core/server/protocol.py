"""Request bodies of the OpenAI-compatible API (pydantic), with OpenAI's and vLLM's field names.

Only the shapes live here; turning a request into :class:`~core.sampling_params.SamplingParams`
is :mod:`core.server.params`. Ranges the engine checks itself (temperature, top_p, ...) are
left to ``SamplingParams`` so there is one source of truth; bounds here only keep a request
from asking for unbounded work (``n``, ``logprobs``) or overflowing an int64 (``seed``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

MAX_N = 128
INT64_MAX = 2**63 - 1
# seed + index (one generator per completion) must stay an int64
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=INT64_MAX - MAX_N)]
# strict: JSON's true and false are not token ids
TokenId = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
Count = Annotated[StrictInt, Field(ge=0, le=20)]


def _check_text(value: Any) -> Any:
    """``value`` (strings anywhere inside it) if every string is valid Unicode text, else ValueError."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = value[exc.start]
            raise ValueError(
                f"the text is not valid Unicode: a lone surrogate {bad!r} (U+{ord(bad):04X}) at character {exc.start}"
            ) from None
    elif isinstance(value, list):
        for item in value:
            _check_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    return value


class _Request(BaseModel):
    # clients (the OpenAI SDK among them) send fields we have no use for: ignore, as vLLM does;
    # Infinity and NaN (which Python's JSON parser reads) are not sampling values
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        return _check_text(value)


class StreamOptions(_Request):
    include_usage: bool = False


class JsonSchemaFormat(_Request):
    """OpenAI's ``response_format.json_schema``."""

    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Request):
    """OpenAI's ``response_format``: ``text``, ``json_object`` or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(_Request):
    """The sampling fields both generation endpoints share (vLLM's extra ones included)."""

    model: str | None = None
    n: Annotated[StrictInt, Field(le=MAX_N)] = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    prompt_logprobs: Count | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: prompt as text, texts, token ids or lists of token ids."""

    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: StrictInt | None = 16
    echo: bool = False
    logprobs: Count | None = None
    suffix: str | None = None
    best_of: StrictInt | None = None


class ContentPart(_Request):
    """A part of a message's content; this server takes ``{"type": "text", "text": ...}`` parts only
    (other types are refused by name when the messages are rendered)."""

    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an assistant's calls, as OpenAI returned them
    tool_call_id: str | None = None  # a tool message's answer to that call


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    logprobs: bool = False
    top_logprobs: Count | None = None
    add_generation_prompt: bool = True
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True


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
