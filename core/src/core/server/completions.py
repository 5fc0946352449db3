"""``POST /v1/completions``: one engine request per prompt, answered whole or streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request

from core.outputs import Logprob, RequestOutput
from core.server.errors import bad_request
from core.server.frontend import Frontend
from core.server.handler import Handler
from core.server.params import completion_params
from core.server.responses import usage
from core.server.streaming import ChoiceCursor, merge, sse


def completion_logprobs(
    fe: Frontend, token_ids: list[int], entries: list[dict[int, Logprob] | None], top_n: int, offset: int
) -> dict[str, list]:
    """OpenAI's completions ``logprobs``: tokens, token_logprobs, top_logprobs, text_offset."""
    result: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, entry in zip(token_ids, entries, strict=False):
        text = fe.token_text(token_id)
        result["tokens"].append(text)
        result["text_offset"].append(offset)
        offset += len(text)
        if entry is None:  # the first prompt token: nothing predicts it
            result["token_logprobs"].append(None)
            result["top_logprobs"].append(None)
            continue
        own = entry.get(token_id)
        result["token_logprobs"].append(own.logprob if own is not None else None)
        top = sorted(entry.items(), key=lambda kv: kv[1].rank if kv[1].rank is not None else 0)
        result["top_logprobs"].append(
            {
                fe.token_text(t): lp.logprob
                for t, lp in top
                if t == token_id or (lp.rank is not None and lp.rank <= top_n)
            }
        )
    return result


def _merge_logprobs(a: dict[str, list] | None, b: dict[str, list]) -> dict[str, list]:
    return b if a is None else {key: a[key] + b[key] for key in a}


async def _prompts(fe: Frontend, prompt: Any) -> list[tuple[str | None, list[int]]]:
    """``(text or None, token ids)`` for each prompt of the request."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise bad_request("prompt must not be empty", "prompt")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    fe.check_queue_fits(len(prompt))  # before tokenizing prompts that could never be queued
    if isinstance(prompt[0], str):
        prompts = [(text, await fe.tokenize(text, limit=fe.max_model_len)) for text in prompt]
    else:
        prompts = [(None, list(ids)) for ids in prompt]
    for _, ids in prompts:
        fe.check_token_ids(ids, "prompt")
    return prompts


class CompletionHandler(Handler):
    """Validates, admits and runs one completions request."""

    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    async def __call__(self, raw: Request) -> Any:
        fe, req = self.fe, self.req
        lora = fe.check_model(req.model)
        params = completion_params(req, fe.vocab_size)
        prompts = await _prompts(fe, req.prompt)
        for _, ids in prompts:
            fe.check_length(len(ids), params.max_tokens)
        self.echo_texts = []
        if req.echo:
            self.echo_texts = [text if text is not None else await fe.detokenize(ids) for text, ids in prompts]
        requests = [(f"{self.id}-{i}", params, ids) for i, (_, ids) in enumerate(prompts)]
        return await self.respond(raw, await fe.start(requests, self.arrival_time, lora))

    def _choice(self, prompt_index: int, out: RequestOutput, c: Any, cursor: ChoiceCursor | None) -> dict[str, Any]:
        """One choice: the whole completion (cursor None) or what is new since the cursor."""
        req = self.req
        is_first = cursor is None or not cursor.is_started
        echo_text = self.echo_texts[prompt_index] if req.echo else ""
        offset = len(echo_text) + (cursor.num_chars if cursor is not None else 0)
        if cursor is None:
            text, new_ids, entries = c.text, c.token_ids, c.logprobs
        else:
            text, new_ids, entries = cursor.advance(c.text, c.token_ids, c.logprobs)
        logprobs = None
        if req.logprobs is not None:
            if req.echo and is_first:
                prompt_entries = out.prompt_logprobs or [None] * len(out.prompt_token_ids)
                logprobs = completion_logprobs(self.fe, out.prompt_token_ids, prompt_entries, req.logprobs, 0)
            logprobs = _merge_logprobs(
                logprobs, completion_logprobs(self.fe, new_ids, entries or [], req.logprobs, offset)
            )
        choice = {
            "index": prompt_index * req.n + c.index,
            "text": (echo_text if is_first else "") + text,
            "logprobs": logprobs,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
        }
        if req.prompt_logprobs is not None and is_first:
            choice["prompt_logprobs"] = _prompt_logprobs_json(out)
        return choice

    def response(self, finals: list[RequestOutput]) -> dict[str, Any]:
        choices = [self._choice(i, out, c, None) for i, out in enumerate(finals) for c in out.outputs]
        return {**self.envelope(self.object_name, choices), "usage": usage(finals)}

    async def events(
        self, streams: list[AsyncIterator[RequestOutput]], finals: list[RequestOutput]
    ) -> AsyncIterator[str]:
        cursors: dict[tuple[int, int], ChoiceCursor] = {}
        async for i, out in merge(streams):
            choices = []
            for c in out.outputs:
                cursor = cursors.setdefault((i, c.index), ChoiceCursor())
                if cursor.is_finished:
                    continue
                choice = self._choice(i, out, c, cursor)
                cursor.is_finished = c.finish_reason is not None
                if choice["text"] or choice["finish_reason"] or (choice["logprobs"] and choice["logprobs"]["tokens"]):
                    cursor.is_started = True
                    choices.append(choice)
            if choices:
                yield sse(self.chunk(choices))
            if out.finished:
                finals.append(out)


def _prompt_logprobs_json(out: RequestOutput) -> list | None:
    if out.prompt_logprobs is None:
        return None
    return [
        None
        if entry is None
        else {
            str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": lp.decoded_token}
            for t, lp in entry.items()
        }
        for entry in out.prompt_logprobs
    ]
