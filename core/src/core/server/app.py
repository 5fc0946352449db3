"""The FastAPI app and ``run_server`` (what ``core serve`` calls).

The engine (or each of ``--data-parallel-size`` replicas) is built and steps in its own
thread before uvicorn starts. A failed worker of a split model stops the server: the
requests in flight end, the others get 503, and ``core serve`` exits with status 1.
SIGINT/SIGTERM drain: no new connections, the requests in flight get ``--drain-timeout``
seconds to finish, then what is left is aborted (streams end with ``finish_reason: "abort"``)
and the engine stops; a second signal aborts at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from core import __version__
from core.async_engine import AsyncEngine
from core.config import EngineConfig
from core.pooling import PoolingEngine, make_engine
from core.server.chat import ChatHandler
from core.server.chat_templates import TemplateBudget
from core.server.completions import CompletionHandler
from core.server.errors import APIError, document_error_statuses, error_responses, install_error_handlers
from core.server.frontend import Frontend
from core.server.lora import add_lora_routes, lora_module
from core.server.middleware import ApiKeyMiddleware, ArrivalMiddleware, BodyLimitMiddleware, arrival_time
from core.server.pooling import add_pooling_routes
from core.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from core.server.streaming import ClientDisconnected
from core.structured.reasoning import get_reasoning_parser
from core.tools import get_tool_parser

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CorsSettings:
    """Cross-origin resource sharing, as vLLM's ``--allowed-origins`` etc. set it."""

    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False


def build_app(
    fe: Frontend, api_key: str | None = None, max_request_bytes: int = 4 << 20, cors: CorsSettings | None = None
) -> Any:
    """The ASGI app serving ``fe``'s engine: FastAPI routes inside the arrival stamp, CORS and the key and body-size checks."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await fe.startup()
        yield
        await asyncio.to_thread(fe.shutdown)
        await fe.close()

    app = FastAPI(title="core", version=__version__, lifespan=lifespan)
    app.state.frontend = fe
    install_error_handlers(app)
    with_key = api_key is not None
    errors = error_responses(with_key=with_key)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, __: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nobody reads it: the client has left

    @app.get("/health", responses=error_responses((503,)))
    async def health() -> Response:
        if not fe.is_running:
            raise APIError(503, "the engine is not running")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(fe.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", responses=error_responses((), with_key))
    async def models() -> dict[str, Any]:
        card = {
            "id": fe.model_name,
            "object": "model",
            "created": started,
            "owned_by": "core",
            "root": fe.model_name,
            "max_model_len": fe.max_model_len,
        }
        return {"object": "list", "data": [card, *fe.loras.cards(started)]}

    @app.post("/v1/completions", responses=errors)
    async def completions(req: CompletionRequest, raw: Request) -> Any:
        return await CompletionHandler(fe, req, arrival_time(raw.scope))(raw)

    @app.post("/v1/chat/completions", responses=errors)
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Any:
        return await ChatHandler(fe, req, arrival_time(raw.scope))(raw)

    @app.post("/tokenize", responses=errors)
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        fe.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError(400, "send exactly one of prompt or messages", "prompt")
        if req.messages is not None:
            ids = await fe.render_chat(req.messages, req.add_generation_prompt, None)
        else:
            ids = await fe.tokenize(req.prompt or "", req.add_special_tokens, limit=fe.max_model_len)
        return {"count": len(ids), "max_model_len": fe.max_model_len, "tokens": ids}

    @app.post("/detokenize", responses=errors)
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        fe.check_model(req.model)
        return {"prompt": await fe.detokenize(req.tokens)}

    add_pooling_routes(app, fe, errors)
    add_lora_routes(app, fe.loras, errors)
    document_error_statuses(app)
    started = int(time.time())
    wrapped: Any = BodyLimitMiddleware(app, max_request_bytes)
    if api_key:
        wrapped = ApiKeyMiddleware(wrapped, api_key)
    cors = cors or CorsSettings()
    wrapped = CORSMiddleware(  # outside the key check: a browser must see a 401 and the preflight needs no key
        wrapped,
        allow_origins=list(cors.allowed_origins),
        allow_methods=list(cors.allowed_methods),
        allow_headers=list(cors.allowed_headers),
        allow_credentials=cors.allow_credentials,
    )
    wrapped = ArrivalMiddleware(wrapped)  # outermost: the stamp precedes reading the body
    wrapped.fastapi_app = app  # tests and tools reach the routes and the OpenAPI schema here
    return wrapped


class _Server(uvicorn.Server):
    """uvicorn, plus: log the URL once listening; drain on the first signal, abort on the second."""

    def __init__(self, config: uvicorn.Config, fe: Frontend, drain_timeout: float) -> None:
        super().__init__(config)
        self.fe = fe
        self.drain_timeout = drain_timeout
        self.abort_timer: threading.Timer | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        for server in getattr(self, "servers", []):
            for sock in server.sockets or ():
                host, port = sock.getsockname()[:2]
                url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
                if host in ("0.0.0.0", "::"):
                    logger.info(
                        "ready: serving on %s (every network interface: reachable from other machines; "
                        "--host 127.0.0.1 for this machine only); here: http://localhost:%d (Ctrl+C to stop)",
                        url,
                        port,
                    )
                else:
                    logger.info("ready: serving on %s (Ctrl+C to stop)", url)

    async def on_tick(self, counter: int) -> bool:
        if self.fe.failure is not None and not self.should_exit:
            logger.error("stopping the server: %s", self.fe.failure)
            self.should_exit = True
        return await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.should_exit or self.drain_timeout <= 0:
            logger.info("signal %d: aborting requests in flight and stopping the engine", sig)
            self.abort_engines()  # does not block: the engine thread aborts and stops
        else:
            logger.info(
                "signal %d: draining: requests in flight have %g s to finish (again: abort now)",
                sig,
                self.drain_timeout,
            )
            self.abort_timer = threading.Timer(self.drain_timeout, self.abort_engines)
            self.abort_timer.daemon = True
            self.abort_timer.start()
        super().handle_exit(sig, frame)
        # uvicorn raises the signal again once it stopped, which kills the process (status
        # 128 + the signal) before the engine shut down; a stop we asked for exits 0
        self._captured_signals.clear()

    def abort_engines(self) -> None:
        """Abort the requests in flight and stop every replica (does not wait)."""
        for engine in self.fe.replicas:
            engine.shutdown(timeout=0)


def run_server(config: EngineConfig, args: argparse.Namespace) -> int:
    """Build the engine replicas, then serve them until SIGINT/SIGTERM or a failed worker.

    :return: the exit status: 0, or 1 when a worker failed.
    """
    tool_parser = None  # before the engines: a wrong flag fails at once
    if args.enable_auto_tool_choice:
        if args.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME: how the model writes calls")
        tool_parser = get_tool_parser(args.tool_call_parser)
    reasoning_parser = get_reasoning_parser(config.reasoning_parser) if config.reasoning_parser else None
    engines: list[AsyncEngine] = []
    try:
        for replica in range(config.data_parallel_size):
            engines.append(AsyncEngine(lambda replica=replica: make_engine(config, data_parallel_rank=replica)))
    except BaseException:
        for engine in engines:
            engine.shutdown()
        raise
    llm = engines[0].engine
    model_name = llm.config.served_model_name or llm.loaded.name
    if isinstance(llm, PoolingEngine):
        logger.info(
            "serving %s on %s with the pooling runner (dtype %s, max_model_len %d, data parallel %d): "
            "/v1/embeddings, /pooling, /classify, /score, /rerank",
            model_name,
            llm.platform.name,
            llm.config.dtype,
            llm.config.max_model_len,
            llm.config.data_parallel_size,
        )
    else:
        num_tokens = llm.kv_plan.num_blocks * llm.config.block_size
        logger.info(
            "serving %s on %s (dtype %s, max_model_len %d, tensor parallel %d, pipeline parallel %d, data parallel %d); KV cache (%s) per replica: %d blocks = %d tokens, max concurrency at max length %.1fx",
            model_name,
            llm.platform.name,
            llm.config.dtype,
            llm.config.max_model_len,
            llm.config.tensor_parallel_size,
            llm.config.pipeline_parallel_size,
            llm.config.data_parallel_size,
            llm.config.kv_cache_dtype,
            llm.kv_plan.num_blocks,
            num_tokens,
            num_tokens / llm.config.max_model_len,
        )
        logger.info(
            "memory: the KV cache takes %.2f GiB per replica, on top of the weights; the process's memory use grows "
            "to include all of it as requests fill its blocks (--kv-cache-memory GiB, or the platform's own "
            "variable, sets it)",
            llm.kv_plan.num_blocks * llm.kv_plan.block_bytes / (1 << 30),
        )
    budget = TemplateBudget(timeout_s=args.chat_template_timeout, max_output_bytes=args.chat_template_max_bytes)
    fe = Frontend(
        engines, model_name, args.max_queue_len, args.chat_template, budget, args.trust_request_chat_template,
        tool_parser, reasoning_parser,
    )  # fmt: skip
    try:  # a bad adapter stops the start
        for name, path in map(lora_module, args.lora_modules or ()):
            asyncio.run(fe.loras.load(name, path))
    except BaseException:
        fe.shutdown()
        raise
    cors = CorsSettings(
        tuple(args.allowed_origins), tuple(args.allowed_methods), tuple(args.allowed_headers), args.allow_credentials
    )
    app = build_app(fe, args.api_key, args.max_request_bytes, cors)
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=args.drain_timeout + 5,  # the drain, then aborted streams end
        log_config=None,  # keep the CLI's logging setup
    )
    server = _Server(uv_config, fe, args.drain_timeout)
    server.run()
    if server.abort_timer is not None:
        server.abort_timer.cancel()
    fe.shutdown()
    if fe.failure is not None:
        logger.error("exiting: %s", fe.failure)
        return 1
    return 0
