"""``POST /v1/chat/completions``: the model's chat template, then one engine request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from core.outputs import CompletionOutput, Logprob, RequestOutput
from core.server.errors import bad_request
from core.server.frontend import Frontend
from core.server.handler import Handler
from core.server.params import chat_params
from core.server.responses import usage
from core.server.streaming import ChoiceCursor, sse


def chat_logprobs(fe: Frontend, token_ids: list[int], entries: list[dict[int, Logprob]], top_n: int) -> dict[str, list]:
    """OpenAI's chat ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""

    def item(token_id: int, lp: Logprob) -> dict[str, Any]:
        text = fe.token_text(token_id)
        return {"token": text, "logprob": lp.logprob, "bytes": list(text.encode("utf-8"))}

    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        top = sorted(
            ((t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= top_n), key=lambda kv: kv[1].rank
        )
        content.append({**item(token_id, entry[token_id]), "top_logprobs": [item(t, lp) for t, lp in top]})
    return {"content": content}


class ChatHandler(Handler):
    """Validates, admits and runs one chat completions request."""

    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    async def __call__(self, raw: Request) -> Any:
        fe, req = self.fe, self.req
        fe.check_model(req.model)
        if req.tools:
            raise bad_request("tools (function calling) are not supported", "tools")
        params = chat_params(req, fe.vocab_size)
        ids = await fe.render_chat(req.messages, req.add_generation_prompt, req.chat_template, req.chat_template_kwargs)
        fe.check_length(len(ids), params.max_tokens)
        return await self.respond(raw, await fe.start([(self.id, params, ids)], self.arrival_time))

    def _logprobs(self, token_ids: list[int], entries: list | None) -> dict | None:
        if not self.req.logprobs:
            return None
        return chat_logprobs(self.fe, token_ids, entries or [], self.req.top_logprobs or 0)

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        (final,) = finals
        choices = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": self._logprobs(c.token_ids, c.logprobs),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in final.outputs
        ]
        return {**self.envelope(self.object_name, choices), "usage": usage(finals)}

    def _delta(self, c: CompletionOutput, cursor: ChoiceCursor) -> dict[str, Any] | None:
        text, new_ids, entries = cursor.advance(c.text, c.token_ids, c.logprobs)
        if not text and c.finish_reason is None and not (self.req.logprobs and new_ids):
            return None
        cursor.is_finished = c.finish_reason is not None
        return {
            "index": c.index,
            "delta": {"content": text} if text else {},
            "logprobs": self._logprobs(new_ids, entries),
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }

    async def events(
        self, streams: list[AsyncIterator[RequestOutput]], finals: list[RequestOutput]
    ) -> AsyncIterator[str]:
        n = self.req.n
        cursors = [ChoiceCursor() for _ in range(n)]
        # the role goes first, as OpenAI sends it
        yield sse(
            self.chunk(
                [
                    {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
                    for i in range(n)
                ]
            )
        )
        async for out in streams[0]:
            deltas = [
                d for c in out.outputs if not cursors[c.index].is_finished and (d := self._delta(c, cursors[c.index]))
            ]
            if deltas:
                yield sse(self.chunk(deltas))
            if out.finished:
                finals.append(out)
