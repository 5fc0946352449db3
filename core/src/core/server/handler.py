"""What the chat and completions handlers share: the response envelope, running the
engine streams to their end or streaming them as server-sent events, and cleaning up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import Request
from fastapi.responses import JSONResponse

from core.outputs import RequestOutput
from core.server.errors import APIError
from core.server.frontend import Frontend, TrackedStream
from core.server.responses import error_event, usage
from core.server.streaming import SSEResponse, collect, sse, until_disconnected


class Handler:
    """One OpenAI request: subclasses validate and start engine streams in ``__call__``,
    then hand them to :meth:`respond`; they build the whole answer (:meth:`response`)
    and the stream's events (:meth:`events`)."""

    #: prefix of the response id, e.g. ``"cmpl"``
    id_prefix: ClassVar[str] = ""
    #: ``object`` of the whole answer and of a stream chunk
    object_name: ClassVar[str] = ""
    chunk_object_name: ClassVar[str] = ""

    def __init__(self, fe: Frontend, req: Any, arrival_time: float) -> None:
        """:param arrival_time: when the HTTP request came in (``time.time()``); its engine requests count from it.

        :raises APIError: 400 when the server's model does not generate (the pooling runner).
        """
        fe.check_generates()
        self.fe = fe
        self.req = req
        self.arrival_time = arrival_time
        self.id = fe.new_id(self.id_prefix)
        self.created = int(time.time())

    def envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.fe.model_name,
            "choices": choices,
        }

    def chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return self.envelope(self.chunk_object_name, choices)

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        """The whole answer from each stream's final output."""
        raise NotImplementedError

    def events(self, streams: list[AsyncIterator[RequestOutput]], finals: list[RequestOutput]) -> AsyncIterator[str]:
        """The stream's ``data:`` events; appends each stream's final output to ``finals``."""
        raise NotImplementedError

    async def respond(self, raw: Request, streams: list[TrackedStream]) -> Any:
        """Stream the answer (``stream: true``) or wait for every stream's end; close the streams either way."""
        if self.req.stream:
            return SSEResponse(self._stream(streams), on_close=lambda: _close(streams))
        try:
            finals = await until_disconnected(raw, _gather(streams))
        finally:
            _close(streams)
        return JSONResponse(self.response(finals))

    async def _stream(self, streams: list[TrackedStream]) -> AsyncIterator[str]:
        finals: list[RequestOutput] = []
        try:
            async for event in self.events(streams, finals):
                yield event
            options = self.req.stream_options
            if options is not None and options.include_usage and finals:
                yield sse({**self.chunk([]), "usage": usage(finals)})
        except (APIError, ValueError, RuntimeError) as exc:  # the engine failed mid-stream: not the client's fault
            yield error_event(exc)
        finally:
            _close(streams)
        yield sse("[DONE]")


def _close(streams: list[TrackedStream]) -> None:
    for s in streams:
        s.close()


async def _gather(streams: list[TrackedStream]) -> list[RequestOutput]:
    return list(await asyncio.gather(*(collect(s) for s in streams)))
