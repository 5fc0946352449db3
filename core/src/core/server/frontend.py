"""What the HTTP handlers share: the engine, tokenization off the event loop, admission, limits.

Tokenizing and the server's chat template run on a small pool of front-end threads (a big
prompt must not stall the event loop, nor the other requests' tokenization); a request's own
chat template runs in :class:`~core.server.chat_templates.TemplateSandbox`'s processes. The
engine steps in its own thread (:class:`~core.async_engine.AsyncEngine`). The event loop only
moves requests and bytes. Every input error is found before a response begins: the engine
takes each request in (or rejects it, a 400) before its stream starts. With
``--data-parallel-size N`` there are N engine replicas (each its own workers, KV cache and
CPUs); every request goes to the replica with the fewest requests in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import uuid
from dataclasses import dataclass
from typing import Any

from core.async_engine import AsyncEngine, EngineDeadError, RequestStream
from core.lora import LoRARequest
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams
from core.sequence import ContextLengthError, check_length
from core.server.chat_templates import (
    RESERVED_VARIABLES,
    TemplateBudget,
    TemplateError,
    TemplateSandbox,
    check_output,
    render,
)
from core.server.errors import APIError, bad_request
from core.server.lora import ServedLoRAs
from core.server.metrics import RequestTracker, ServerMetrics
from core.structured import StructuredOutputsParams
from core.structured.reasoning import ReasoningParser
from core.tools import ToolParser, template_messages
from core.tools.messages import reads_tools

_KNOWN_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

#: seconds a request's structured outputs grammar may take to compile
COMPILE_TIMEOUT_S = 10.0

#: a text prompt longer than this many characters a token of the context is tokenized in two
#: steps: first that many characters a token; a prefix with twice the context's tokens proves the
#: whole prompt too long without tokenizing all of it
PREFIX_CHARS_PER_TOKEN = 16


@dataclass
class Ticket:
    """One admitted engine request; it leaves the queue at its first output (or its end)."""

    frontend: Frontend
    is_queued: bool = True

    def release(self) -> None:
        if self.is_queued:
            self.is_queued = False
            self.frontend.num_queued -= 1


class TrackedStream:
    """One engine request as the handlers see it: its outputs, with metrics and its ticket.

    :meth:`close` (also on a stream never iterated) releases the ticket and, before the
    request's end, aborts it.
    """

    def __init__(self, fe: Frontend, replica: int, ticket: Ticket, stream: RequestStream) -> None:
        self.fe = fe
        self.replica = replica
        self.ticket = ticket
        self.stream = stream
        self.tracker: RequestTracker = fe.metrics.track()
        self._is_closed = False

    def __aiter__(self) -> TrackedStream:
        return self

    async def __anext__(self) -> RequestOutput:
        try:
            out = await self.stream.__anext__()
        except EngineDeadError as exc:
            self.close()
            raise APIError(503, f"the engine is not running: {exc}") from exc
        except BaseException:
            self.close()
            raise
        self.ticket.release()
        self.tracker.observe(out)
        return out

    def close(self) -> None:
        if not self._is_closed:
            self._is_closed = True
            self.ticket.release()
            self.fe.in_flight[self.replica] -= 1
            self.stream.close()

    async def aclose(self) -> None:
        self.close()


class Frontend:
    """The server's view of its engine replicas: model name, limits, tokenizer, admission, routing, streams.

    :param engines: one engine, or the data-parallel replicas (the same model and settings).
    :param chat_template: the template of chat requests that bring none (``core serve
        --chat-template``); None: the model's own.
    :param template_budget: what one chat template render may take.
    :param tool_parser: how the model writes tool calls (``--tool-call-parser``), when the server
        answers ``tool_choice: auto`` (``--enable-auto-tool-choice``); None: it refuses it.
    :param reasoning_parser: how the model marks its reasoning (``--reasoning-parser``); None: no split.
    :param trust_request_chat_template: whether a request may bring its own chat template
        (rendered in a sandbox process within ``template_budget``); without it such a request is a 400.
    """

    def __init__(
        self, engines: AsyncEngine | list[AsyncEngine], model_name: str, max_queue_len: int,
        chat_template: str | None = None, template_budget: TemplateBudget | None = None,
        trust_request_chat_template: bool = False, tool_parser: ToolParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
    ) -> None:  # fmt: skip
        self.replicas = engines if isinstance(engines, list) else [engines]
        self.engine = self.replicas[0]  # the tokenizer and limits: the same in every replica
        llm = self.engine.engine
        self.model_name = model_name
        self.tokenizer = llm.tokenizer
        self.chat_template = chat_template or (self.tokenizer.chat_template if self.tokenizer is not None else None)
        self.template_budget = template_budget or TemplateBudget()
        self.sandbox = TemplateSandbox(self.template_budget) if trust_request_chat_template else None
        self.tool_parser = tool_parser  # for tool_choice "auto" (--enable-auto-tool-choice)
        self.reasoning_parser = reasoning_parser  # splits <think> text out of chat answers
        self.loras = ServedLoRAs(self.replicas, model_name)  # adapters a request's model field may name
        self.max_model_len: int = llm.config.max_model_len
        self.runner: str = llm.config.runner  # "pooling": it embeds and scores, it does not generate
        self.vocab_size: int = llm.loaded.hf_config.vocab_size
        self.max_queue_len = max_queue_len
        self.num_queued = 0  # admitted requests without a first output yet
        self.pending = [0] * len(self.replicas)  # routed to each replica, compiling their grammars
        self.in_flight = [0] * len(self.replicas)  # requests routed to each replica and not finished
        self.metrics = ServerMetrics(self.stats, model_name)
        # tokenizers release the GIL while they encode: a few threads keep one huge prompt
        # from holding up the small ones
        num_threads = max(4, min(8, os.cpu_count() or 1))
        self._tokenizer_threads = concurrent.futures.ThreadPoolExecutor(num_threads, "core-tokenizer")
        self._token_text: dict[int, str] = {}

    async def startup(self) -> None:
        """Start what the front end runs beside the engine (the chat template sandbox's workers)."""
        if self.sandbox is not None:
            await self.sandbox.start()

    async def close(self) -> None:
        self._tokenizer_threads.shutdown(wait=False, cancel_futures=True)
        if self.sandbox is not None:
            await self.sandbox.close()

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
        """Each replica's stats, with the requests routed to it that are compiling their grammars counted as waiting
        (its engine counts the ones it was handed: :meth:`core.async_engine.AsyncEngine.stats`)."""
        stats = [engine.stats() for engine in self.replicas]
        for s, pending in zip(stats, self.pending, strict=True):
            s["num_waiting"] = s.get("num_waiting", 0) + pending
        return stats

    # -- validation ------------------------------------------------------------------------
    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter ``model`` names (None: the base model); 404 for a name the server does not serve."""
        if model is None or model == self.model_name:
            return None
        lora = self.loras.get(model)
        if lora is None:
            served = ", ".join(repr(name) for name in (self.model_name, *self.loras.by_name))
            raise APIError(404, f"The model {model!r} does not exist; this server serves {served}", "model",
                           "model_not_found")  # fmt: skip
        return lora

    def check_generates(self) -> None:
        """400 when the model runs with the pooling runner: it serves embeddings and scores, not text."""
        if self.runner == "pooling":
            raise bad_request(
                f"model {self.model_name} runs with the pooling runner: it serves /v1/embeddings, /pooling, "
                "/classify, /score and /rerank, not text generation",
                "model",
            )

    def check_length(self, num_prompt_tokens: int, max_tokens: int | None) -> None:
        """400 when the prompt plus ``max_tokens`` cannot fit the model's context (:func:`core.sequence.check_length`)."""
        try:
            check_length(num_prompt_tokens, max_tokens, self.max_model_len)
        except ContextLengthError as exc:
            raise bad_request(str(exc), exc.param) from exc

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        """400 when a token id is outside the vocabulary."""
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise bad_request(f"{param} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})", param)

    def check_queue_fits(self, num_prompts: int) -> None:
        """400 when a request's prompts could never fit the queue, even an empty one."""
        if num_prompts > self.max_queue_len:
            raise bad_request(
                f"this request has {num_prompts} prompts; the server queues at most {self.max_queue_len} "
                "(core serve --max-queue-len): send them in several requests",
                "prompt",
            )

    def admit(self, num_requests: int) -> list[Ticket]:
        """Tickets for ``num_requests`` engine requests: 400 when they could never fit the queue, 503 when it is full now."""
        if not self.is_running:
            raise APIError(503, "the engine is not running (shutting down or failed)")
        self.check_queue_fits(num_requests)
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
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_threads, fn, *args)

    async def tokenize(self, text: str, add_special_tokens: bool = True, limit: int | None = None) -> list[int]:
        """Token ids of ``text``.

        :param limit: when given, a prompt provably longer than this many tokens is refused
            (400) after tokenizing a prefix of it (see :data:`PREFIX_CHARS_PER_TOKEN`).
        """
        tokenizer = self._require_tokenizer()

        def encode() -> list[int]:
            if limit is not None and len(text) > PREFIX_CHARS_PER_TOKEN * limit:
                prefix = text[: PREFIX_CHARS_PER_TOKEN * limit]
                num_tokens = len(tokenizer.encode(prefix, add_special_tokens=add_special_tokens))
                if num_tokens > 2 * limit:
                    raise bad_request(
                        f"the prompt is too long: its first {len(prefix)} characters alone are {num_tokens} "
                        f"tokens, and this model's context is {limit} tokens",
                        "prompt",
                    )
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

        return await self._in_tokenizer_thread(encode)

    async def detokenize(self, token_ids: list[int]) -> str:
        tokenizer = self._require_tokenizer()
        self.check_token_ids(token_ids, "tokens")
        return await self._in_tokenizer_thread(tokenizer.decode, token_ids)

    async def render_chat(
        self,
        messages: list[Any],
        add_generation_prompt: bool,
        chat_template: str | None,
        chat_template_kwargs: dict[str, Any] | None = None,
        functions: dict[str, dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of ``messages`` (:class:`~core.server.protocol.ChatMessage`) with the chat template.

        :param chat_template: the request's own template: refused unless the server trusts
            request templates, then rendered in the sandbox; None: the server's template.
        :param chat_template_kwargs: more template variables (data; they may not replace the
            render's own: ``messages``, ``tools``, ...).
        :param functions: the request's tools (:func:`core.tools.tool_functions`), for the
            template (:func:`core.tools.template_messages`).
        """
        tokenizer = self._require_tokenizer()
        template = chat_template or self.chat_template or ""
        plain = template_messages([self._message(i, m) for i, m in enumerate(messages)], template, functions)
        kwargs = chat_template_kwargs or {}
        reserved = sorted(RESERVED_VARIABLES & kwargs.keys())
        if reserved:
            raise bad_request(
                f"chat_template_kwargs may not set {', '.join(reserved)}: the render sets those itself"
                + (" (a request's template goes in the field chat_template)" if "chat_template" in reserved else ""),
                "chat_template_kwargs",
            )
        variables = {**tokenizer.special_tokens_map, **kwargs}
        if functions and reads_tools(template):
            variables["tools"] = [{"type": "function", "function": fn} for fn in functions.values()]
        budget = self.template_budget
        try:
            if chat_template is not None:
                if self.sandbox is None:
                    raise bad_request(
                        "this server does not run chat templates sent with requests; leave chat_template out to "
                        "use the model's, or start the server with --trust-request-chat-template",
                        "chat_template",
                    )
                text = await self.sandbox.render(chat_template, plain, add_generation_prompt, variables)
            else:
                if self.chat_template is None:
                    raise bad_request(
                        f"model {self.model_name} has no chat template: start the server with --chat-template FILE, "
                        "or send prompts to /v1/completions",
                        "messages",
                    )
                text = await self._in_tokenizer_thread(
                    lambda: check_output(
                        render(self.chat_template, plain, add_generation_prompt, variables), budget.max_output_bytes
                    )
                )
        except APIError:
            raise
        except TemplateError as exc:
            raise bad_request(str(exc), "chat_template" if chat_template is not None else "messages") from exc
        except Exception as exc:  # jinja errors (a template's raise_exception, syntax) are the request's fault
            raise bad_request(
                f"the chat template failed on these messages: {type(exc).__name__}: {exc}", "messages"
            ) from exc
        return await self.tokenize(text, add_special_tokens=False, limit=self.max_model_len)

    def _message(self, index: int, message: Any) -> dict[str, Any]:
        """One :class:`~core.server.protocol.ChatMessage` as a plain dict (checked role and content)."""
        plain: dict[str, Any] = {
            "role": self._role(index, message.role),
            "content": self._content(index, message.content),
        }
        if message.tool_calls:
            for j, call in enumerate(message.tool_calls):
                function = call.get("function")
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise bad_request(
                        f"messages[{index}].tool_calls[{j}] must be {{'id': ..., 'type': 'function', 'function': "
                        "{'name': ..., 'arguments': ...}}",
                        f"messages.{index}.tool_calls.{j}",
                    )
            plain["tool_calls"] = message.tool_calls
        if message.tool_call_id is not None:
            plain["tool_call_id"] = message.tool_call_id
        return plain

    @staticmethod
    def _role(index: int, role: str) -> str:
        if role not in _KNOWN_ROLES:
            raise bad_request(
                f"messages[{index}].role {role!r} is not supported; use one of: system, user, assistant, tool",
                f"messages.{index}.role",
            )
        return _KNOWN_ROLES[role]

    @staticmethod
    def _content(index: int, content: Any) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        for j, part in enumerate(content):
            if part.type != "text":
                raise bad_request(
                    f"messages[{index}].content[{j}] is a part of type {part.type!r}: this model takes text only",
                    f"messages.{index}.content.{j}.type",
                )
            if part.text is None:
                raise bad_request(f"messages[{index}].content[{j}] has no text", f"messages.{index}.content.{j}.text")
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

    async def _compile(self, engine: AsyncEngine, spec: StructuredOutputsParams) -> None:
        """Compile a request's grammar on a front-end thread (the engine then finds it cached):
        400 when it is not valid or takes longer than :data:`COMPILE_TIMEOUT_S`."""
        param = "structured_outputs"
        try:
            await asyncio.wait_for(self._in_tokenizer_thread(engine.engine.structured.compile, spec), COMPILE_TIMEOUT_S)
        except TimeoutError:
            raise bad_request(
                f"the {spec.kind} constraint did not compile within {COMPILE_TIMEOUT_S:g} s: simplify it", param
            ) from None
        except ValueError as exc:
            raise bad_request(str(exc), param) from None

    async def start(
        self,
        requests: list[tuple[str, SamplingParams, list[int]]],
        arrival_time: float,
        lora: LoRARequest | None = None,
    ) -> list[TrackedStream]:
        """Admit ``(request id, params, prompt ids)`` requests and have the engines take them in.

        Raises before anything streams: 400 for a request an engine rejects (the others are
        aborted), 503 when the queue is full or the engine is not running.

        :param arrival_time: when the HTTP request came in: TTFT and queue time count from it.
        :param lora: the LoRA adapter they run with (:meth:`check_model`), None for the base model.
        """
        tickets = self.admit(len(requests))
        streams: list[TrackedStream] = []
        try:
            for (request_id, params, prompt_ids), ticket in zip(requests, tickets, strict=True):
                streams.append(await self._start_one(request_id, params, prompt_ids, ticket, arrival_time, lora))
        except BaseException:
            for stream in streams:
                stream.close()
            for ticket in tickets:
                ticket.release()
            raise
        return streams

    async def _start_one(
        self, request_id: str, params: SamplingParams, prompt_ids: list[int], ticket: Ticket, arrival_time: float,
        lora: LoRARequest | None,
    ) -> TrackedStream:  # fmt: skip
        replica = min(range(len(self.replicas)), key=self.in_flight.__getitem__)
        if params.structured_outputs is not None:  # counted as waiting while its grammar compiles
            self.pending[replica] += 1
            try:
                await self._compile(self.replicas[replica], params.structured_outputs)
            finally:
                self.pending[replica] -= 1
        try:  # from the call on, the engine counts it (AsyncEngine.stats): no await in between
            stream = await self.replicas[replica].add_request(
                request_id, params, prompt_token_ids=prompt_ids, arrival_time=arrival_time, lora_request=lora
            )
        except EngineDeadError as exc:
            raise APIError(503, f"the engine is not running: {exc}") from exc
        self.in_flight[replica] += 1
        return TrackedStream(self, replica, ticket, stream)
