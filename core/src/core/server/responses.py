"""Pieces every response shares: usage counts and the in-stream error event."""

from __future__ import annotations

import logging
from typing import Any

from core.outputs import RequestOutput
from core.server.errors import APIError
from core.server.streaming import sse

logger = logging.getLogger(__name__)


def usage(finals: list[RequestOutput]) -> dict[str, Any]:
    """OpenAI's ``usage``: prompt, completion and total tokens (cached prompt tokens as a detail)."""
    prompt = sum(len(out.prompt_token_ids) for out in finals)
    completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(out.num_cached_tokens for out in finals)},
    }


def error_event(exc: Exception) -> str:
    """An error met after the stream started (status 200 already sent): one ``data: {"error": ...}`` event."""
    if isinstance(exc, APIError):
        error = exc
    elif isinstance(exc, ValueError):
        error = APIError(400, str(exc))
    else:
        logger.error("stream failed: %s: %s", type(exc).__name__, exc)
        error = APIError(500, f"{type(exc).__name__}: {exc}")
    return sse(error.body())
