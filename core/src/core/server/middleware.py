"""Pure ASGI middleware: the arrival stamp, the request-body size limit (413) and the API key (401).

Pure ASGI rather than ``BaseHTTPMiddleware`` so ``receive`` stays the server's own: the
handlers listen on it for the client's disconnect.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Awaitable, Callable

from core.server.errors import APIError

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Reachable without the key: probes and scrapers should not need it.
PUBLIC_PATHS = frozenset({"/health", "/metrics", "/version", "/openapi.json", "/docs", "/redoc"})


async def _answer(error: APIError, scope: Scope, receive: Receive, send: Send) -> None:
    await error.response()(scope, receive, send)


class ArrivalMiddleware:
    """Stamp every request with the wall-clock time it came in (``time.time()``, the engine's
    clock), before its body is read, validated or tokenized: the engine's request metrics
    (TTFT, queue time) count from it, so ``/metrics`` sees what the client waited."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrival_time"] = time.time()
        await self.app(scope, receive, send)


def arrival_time(scope: Scope) -> float:
    """The stamp :class:`ArrivalMiddleware` put on the request of ``scope``."""
    return scope["state"]["arrival_time"]


class BodyLimitMiddleware:
    """Answer 413 when the body is larger than ``max_bytes``.

    Checked on ``Content-Length`` before reading, and while reading for bodies sent without
    one (chunked). The body is read up front and replayed to the app, so the app never sees
    a half-read body; after it, ``receive`` is the server's again (disconnects come through).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        too_large = APIError(413, f"the request body is larger than the server's limit of {self.max_bytes} bytes")
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _answer(APIError(400, "Content-Length is not an integer"), scope, receive, send)
                    return
                if declared > self.max_bytes:
                    await _answer(too_large, scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await _answer(too_large, scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replay: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replaying_receive() -> Message:
            return replay.pop() if replay else await receive()

        await self.app(scope, replaying_receive, send)


class ApiKeyMiddleware:
    """Require ``Authorization: Bearer <key>`` on every path but :data:`PUBLIC_PATHS`."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is None:
            error = APIError(
                401, "missing API key: send the header 'Authorization: Bearer <key>'", code="invalid_api_key"
            )
            await _answer(error, scope, receive, send)
        elif not hmac.compare_digest(given, self.expected):
            await _answer(APIError(401, "incorrect API key", code="invalid_api_key"), scope, receive, send)
        else:
            await self.app(scope, receive, send)
