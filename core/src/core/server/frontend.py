"""What the HTTP handlers share: the engine, tokenization off the event loop, admission, limits.

Tokenizing and chat templating run on one worker thread (a big prompt must not stall the
event loop, and one thread keeps the tokenizer's use simple); the engine steps in its own
thread (:class:`~core.async_engine.AsyncEngine`). The event loop only moves requests and bytes.
With ``--data-parallel-size N`` there are N engine replicas (each its own workers, KV cache
and CPUs); every request goes to the replica with the fewest requests in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from core.async_engine import AsyncEngine, EngineDeadError
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams
from core.sequence import ContextLengthError, check_length
from core.server.errors import APIError, bad_request
from core.server.metrics import ServerMetrics

_KNOWN_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


@dataclass
class Ticket:
    """One admitted engine request; it leaves the queue at its first output (or its end)."""

    frontend: Frontend
    is_queued: bool = True
    replica: int | None = None  # where it was routed, once it was

    def release(self) -> None:
        if self.is_queued:
            self.is_queued = False
            self.frontend.num_queued -= 1
            if self.replica is not None:
                self.frontend.queued[self.replica] -= 1


class Frontend:
    """The server's view of its engine replicas: model name, limits, tokenizer, admission, routing, streams.

    :param engines: one engine, or the data-parallel replicas (the same model and settings).
    :param chat_template: the template of chat requests that bring none (``core serve
        --chat-template``); None: the model's own.
    """

    def __init__(
        self, engines: AsyncEngine | list[AsyncEngine], model_name: str, max_queue_len: int,
        chat_template: str | None = None,
    ) -> None:  # fmt: skip
        self.replicas = engines if isinstance(engines, list) else [engines]
        self.chat_template = chat_template
        self.engine = self.replicas[0]  # the tokenizer and limits: the same in every replica
        llm = self.engine.engine
        self.model_name = model_name
        self.tokenizer = llm.tokenizer
        self.max_model_len: int = llm.config.max_model_len
        self.vocab_size: int = llm.loaded.hf_config.vocab_size
        self.max_queue_len = max_queue_len
        self.num_queued = 0  # admitted requests without a first output yet
        self.queued = [0] * len(self.replicas)  # of those, routed to each replica
        self.in_flight = [0] * len(self.replicas)  # requests routed to each replica and not finished
        self.metrics = ServerMetrics(self.stats, model_name)
        self._tokenizer_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="core-tokenizer")
        self._token_text: dict[int, str] = {}

    def close(self) -> None:
        self._tokenizer_thread.shutdown(wait=False, cancel_futures=True)

    @property
    def is_running(self) -> bool:
        """Every replica is running (one that failed stops the server)."""
        return all(engine.is_running for engine in self.replicas)

    @property
    def failure(self) -> BaseException | None:
        """Why a replica stopped for good (a failed worker), or None."""
        return next((engine.failure for engine in self.replicas if engine.failure is not None), None)

    def shutdown(self) -> None:
        for engine in self.replicas:
            engine.shutdown()

    def stats(self) -> list[dict[str, Any]]:
        """Each replica's stats, with requests routed to it but not yet in its engine counted as waiting."""
        stats = [engine.stats() for engine in self.replicas]
        for s, queued in zip(stats, self.queued, strict=True):
            s["num_waiting"] = max(s["num_waiting"], queued)
        return stats

    # -- validation ------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(
                404,
                f"The model {model!r} does not exist; this server serves {self.model_name!r}",
                "model",
                "model_not_found",
            )

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        """400 when the prompt plus ``max_tokens`` cannot fit the model's context (:func:`core.sequence.check_length`)."""
        try:
            check_length(num_prompt_tokens, max_tokens, self.max_model_len)
        except ContextLengthError as exc:
            raise bad_request(str(exc), exc.param) from exc

    def admit(self, num_requests: int) -> list[Ticket]:
        """Tickets for ``num_requests`` engine requests, or 503 when the queue is full."""
        if not self.is_running:
            raise APIError(503, "the engine is not running (shutting down or failed)")
        if self.num_queued + num_requests > self.max_queue_len:
            raise APIError(
                503,
                f"the server is overloaded: {self.num_queued} requests are waiting (limit {self.max_queue_len}); retry later",
            )
        self.num_queued += num_requests
        return [Ticket(self) for _ in range(num_requests)]

    # -- tokenizer -------------------------------------------------------------------------
    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise bad_request("this server has no tokenizer: send prompts as token ids")
        return self.tokenizer

    async def _in_tokenizer_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn, *args)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        tokenizer = self._require_tokenizer()
        return await self._in_tokenizer_thread(lambda: tokenizer.encode(text, add_special_tokens=add_special_tokens))

    async def detokenize(self, token_ids: list[int]) -> str:
        tokenizer = self._require_tokenizer()
        if any(t >= self.vocab_size for t in token_ids):
            raise bad_request(f"token ids must be in [0, {self.vocab_size})", "tokens")
        return await self._in_tokenizer_thread(tokenizer.decode, token_ids)

    async def render_chat(
        self, messages: list[Any], add_generation_prompt: bool, chat_template: str | None
    ) -> list[int]:
        """Token ids of ``messages`` (:class:`~core.server.protocol.ChatMessage`) with the chat template."""
        plain = [
            {"role": self._role(i, m.role), "content": self._content(i, m.content)} for i, m in enumerate(messages)
        ]
        llm = self.engine.engine
        try:
            return await self._in_tokenizer_thread(
                llm.apply_chat_template, plain, add_generation_prompt, chat_template or self.chat_template
            )
        except ValueError:
            raise
        except Exception as exc:  # jinja errors (a template's raise_exception, syntax) are the request's fault
            raise bad_request(
                f"the chat template failed on these messages: {type(exc).__name__}: {exc}", "messages"
            ) from exc

    @staticmethod
    def _role(index: int, role: str) -> str:
        if role not in _KNOWN_ROLES:
            raise bad_request(
                f"messages[{index}].role {role!r} is not supported; use one of: system, user, assistant",
                f"messages.{index}.role",
            )
        return _KNOWN_ROLES[role]

    @staticmethod
    def _content(index: int, content: Any) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(part.text for part in content)

    def token_text(self, token_id: int) -> str:
        """The text of one token, as the completions/chat logprobs show it (cached)."""
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id]) if self.tokenizer is not None else f"token_id:{token_id}"
            self._token_text[token_id] = text
        return text

    # -- generation ------------------------------------------------------------------------
    @staticmethod
    def new_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    async def generate(
        self, request_id: str, params: SamplingParams, prompt_ids: list[int], ticket: Ticket, arrival_time: float
    ) -> AsyncIterator[RequestOutput]:
        """The engine's cumulative outputs of one request, with metrics; aborts when closed early.

        :param arrival_time: when the HTTP request came in: TTFT and queue time count from it.
        """
        tracker = self.metrics.track()
        replica = min(range(len(self.replicas)), key=self.in_flight.__getitem__)
        if ticket.is_queued:
            ticket.replica = replica
            self.queued[replica] += 1
        self.in_flight[replica] += 1
        stream = self.replicas[replica].generate(
            request_id, params, prompt_token_ids=prompt_ids, arrival_time=arrival_time
        )
        try:
            async for out in stream:
                ticket.release()
                tracker.observe(out)
                yield out
        except EngineDeadError as exc:
            raise APIError(503, f"the engine is not running: {exc}") from exc
        finally:
            ticket.release()
            self.in_flight[replica] -= 1
            await stream.aclose()
