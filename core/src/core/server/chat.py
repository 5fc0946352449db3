"""``POST /v1/chat/completions``: the model's chat template, then one engine request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from core.outputs import CompletionOutput, Logprob, RequestOutput
from core.server.chat_tools import ToolMode, ToolStream
from core.server.errors import bad_request
from core.server.frontend import Frontend
from core.server.handler import Handler
from core.server.params import chat_params
from core.server.responses import usage
from core.server.streaming import ChoiceCursor, sse
from core.structured.reasoning import ReasoningStream


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
        lora = fe.check_model(req.model)
        params = chat_params(req, fe.vocab_size)
        self.tools = ToolMode.of(req.tools, req.tool_choice, fe.tool_parser, req.parallel_tool_calls)
        if self.tools.constraint is not None:
            if params.structured_outputs is not None:
                raise bad_request(
                    f"tool_choice {self.tools.choice!r} constrains the answer itself: leave out response_format "
                    "and structured_outputs",
                    "tool_choice",
                )
            params = params.clone(structured_outputs=self.tools.constraint)
        ids = await fe.render_chat(
            req.messages, req.add_generation_prompt, req.chat_template, req.chat_template_kwargs, self.tools.functions
        )
        fe.check_length(len(ids), params.max_tokens)
        return await self.respond(raw, await fe.start([(self.id, params, ids)], self.arrival_time, lora))

    def _logprobs(self, token_ids: list[int], entries: list | None) -> dict | None:
        if not self.req.logprobs:
            return None
        return chat_logprobs(self.fe, token_ids, entries or [], self.req.top_logprobs or 0)

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        (final,) = finals
        choices = []
        for c in final.outputs:
            parser = self.fe.reasoning_parser
            reasoning, text = parser.split(c.text) if parser is not None else (None, c.text)
            content, calls, finish_reason = self.tools.split(text, c.finish_reason)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if reasoning is not None:
                message["reasoning"] = message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [call.to_json() for call in calls]
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(c.token_ids, c.logprobs),
                    "finish_reason": finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
        return {**self.envelope(self.object_name, choices), "usage": usage(finals)}

    def _delta(
        self, c: CompletionOutput, cursor: ChoiceCursor, reasoning: ReasoningStream, tools: ToolStream
    ) -> dict[str, Any] | None:
        _, new_ids, entries = cursor.advance(c.text, c.token_ids, c.logprobs)
        thought, content = reasoning.advance(c.text, c.finish_reason is not None)
        text, calls, finish_reason = tools.advance(content, c.finish_reason)
        if not (text or calls or thought) and c.finish_reason is None and not (self.req.logprobs and new_ids):
            return None
        cursor.is_finished = c.finish_reason is not None
        delta: dict[str, Any] = {"content": text} if text else {}
        if thought:
            delta["reasoning"] = delta["reasoning_content"] = thought
        if calls:
            delta["tool_calls"] = calls
        return {
            "index": c.index,
            "delta": delta,
            "logprobs": self._logprobs(new_ids, entries),
            "finish_reason": finish_reason,
            "stop_reason": c.stop_reason,
        }

    async def events(
        self, streams: list[AsyncIterator[RequestOutput]], finals: list[RequestOutput]
    ) -> AsyncIterator[str]:
        n = self.req.n
        cursors = [ChoiceCursor() for _ in range(n)]
        tool_streams = [ToolStream(self.tools) for _ in range(n)]
        reasoning = [ReasoningStream(self.fe.reasoning_parser) for _ in range(n)]
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
                d
                for c in out.outputs
                if not cursors[c.index].is_finished
                and (d := self._delta(c, cursors[c.index], reasoning[c.index], tool_streams[c.index]))
            ]
            if deltas:
                yield sse(self.chunk(deltas))
            if out.finished:
                finals.append(out)
