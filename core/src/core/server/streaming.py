"""Server-sent events and client disconnects.

A client that goes away must free its request at once, not at the next token: both the
streaming response and the non-streaming wait race the work against the ASGI
``http.disconnect`` message and cancel the work, which closes the engine stream (abort).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from core.outputs import RequestOutput

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event: ``data: {...}\\n\\n``."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"data: {data}\n\n"


class SSEResponse(StreamingResponse):
    """A ``text/event-stream`` response that stops (and closes its iterator) when the client leaves."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        # a generator the client left before its first event never runs its ``finally``:
        # what it would have released is released here
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({streaming, listening}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (streaming, listening):
                task.cancel()
            await asyncio.gather(streaming, listening, return_exceptions=True)
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
            if self.on_close is not None:
                self.on_close()
        if streaming.done() and not streaming.cancelled():
            exc = streaming.exception()
            if exc is not None and not isinstance(exc, OSError):  # OSError: the client went away mid-send
                raise exc


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``; cancel it and raise :class:`ClientDisconnected` if the client leaves first."""

    async def wait_for_disconnect() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def merge(streams: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Interleave several engine streams as ``(stream index, output)`` in arrival order."""
    if len(streams) == 1:
        async for out in streams[0]:
            yield 0, out
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
            queue.put_nowait((index, done))
        except Exception as exc:  # handed to the consumer
            queue.put_nowait((index, exc))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def collect(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    """The final output of a stream."""
    final = None
    async for out in stream:
        final = out
    if final is None:
        raise RuntimeError("the engine ended a request without any output")
    return final


class ChoiceCursor:
    """How much of one completion a stream has sent; ``advance`` returns what is new."""

    def __init__(self) -> None:
        self.num_chars = 0
        self.num_tokens = 0
        self.is_started = False  # something was sent (the echoed prompt goes first)
        self.is_finished = False

    def advance(self, text: str, token_ids: list[int], logprobs: list | None) -> tuple[str, list[int], list | None]:
        """The new text, token ids and logprob entries since the last call."""
        delta = text[self.num_chars :]
        new_ids = token_ids[self.num_tokens :]
        new_logprobs = logprobs[self.num_tokens :] if logprobs is not None else None
        self.num_chars = max(self.num_chars, len(text))
        self.num_tokens = len(token_ids)
        return delta, new_ids, new_logprobs
