"""Request bodies of the pooling endpoints (vLLM's and OpenAI's field names): embeddings, pooling,
classify, score and rerank. They share :mod:`core.server.protocol`'s base (unknown fields ignored,
text checked)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from core.server.protocol import TokenId, _Request

#: one input or several: a text, texts, token ids, or lists of token ids
Input = str | list[str] | list[TokenId] | list[list[TokenId]]
#: -1: the model's limit; k: keep the input's last k tokens (a text: truncated by the tokenizer)
Truncation = Annotated[StrictInt, Field(ge=-1)]


class PoolingFields(_Request):
    model: str | None = None
    truncate_prompt_tokens: Truncation | None = None
    user: str | None = None


class EmbeddingRequest(PoolingFields):
    """``POST /v1/embeddings`` (OpenAI's shape, vLLM's extra fields)."""

    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    normalize: bool | None = None


class PoolingRequest(PoolingFields):
    """``POST /pooling``: the pooled vectors as they are (vLLM's ``data``)."""

    input: Input
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    normalize: bool | None = None


class ClassificationRequest(PoolingFields):
    """``POST /classify``: class probabilities of a ``*ForSequenceClassification`` model."""

    input: Input


class ScoreRequest(PoolingFields):
    """``POST /score``: ``text_1`` against each of ``text_2`` (1:N), or pairwise (N:N)."""

    text_1: str | Annotated[list[str], Field(min_length=1)]
    text_2: str | Annotated[list[str], Field(min_length=1)]


class RerankRequest(PoolingFields):
    """``POST /rerank`` (Jina's and Cohere's shape): ``documents`` ordered by relevance to ``query``."""

    query: str
    documents: Annotated[list[str], Field(min_length=1)]
    top_n: Annotated[StrictInt, Field(ge=0)] | None = None
    return_documents: bool = True
