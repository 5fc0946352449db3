"""The engine in its own thread, driven from asyncio: add a request, stream it, abort it.

The engine is built in its own thread (the platform's ``init_device`` runs there, once,
and may bind it) and that thread is the only one that touches it; the event loop only
moves requests in and outputs out, so the HTTP front end stays responsive while the
engine is saturated. Commands travel on one FIFO queue; outputs come back through
``loop.call_soon_threadsafe``. A request is admitted while a step runs: it is stamped with
its arrival (by the caller, e.g. when the HTTP request came in) and queued, and the engine
thread moves every queued command into the engine at the next step boundary, in the order
they came, before it schedules that step (an idle engine wakes at once). The scheduler
orders waiting requests by their arrival stamps, so time spent queued counts in their
metrics (queue time, TTFT). A failed worker of a split model
(:class:`~core.distributed.executor.WorkerFailed`, found by a step or, while idle, by a
health check every second) stops the engine for good: :attr:`AsyncEngine.failure` says
why and every stream ends with :class:`EngineDeadError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from core.distributed.executor import WorkerFailed
from core.engine import LLMEngine
from core.lora import LoRARequest
from core.outputs import RequestOutput
from core.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

#: seconds between health checks of an idle engine's workers
HEALTH_CHECK_INTERVAL_S = 1.0


class EngineDeadError(RuntimeError):
    """The engine thread has stopped; no request can be served."""


class AsyncEngine:
    """Wraps an :class:`LLMEngine` with a stepping thread and an asyncio interface."""

    def __init__(self, build: Callable[[], LLMEngine]) -> None:
        """Build the engine with ``build()`` in the engine thread, then place the calling
        (front-end) thread as the platform wants.

        :raises Exception: whatever ``build`` raised (a bad setting, no device).
        """
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stop = threading.Event()
        self.engine: LLMEngine
        self._stats: dict[str, Any] = {}
        # requests handed to add_request whose command has not run yet: counted as waiting by stats()
        # until the engine thread takes them in (it then drops them here before the next snapshot)
        self._adding = 0
        self._adding_lock = threading.Lock()  # changed from both threads
        #: why the engine stopped for good (a worker failed), or None
        self.failure: WorkerFailed | None = None
        built: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(build, built), name="core-engine", daemon=True)
        self._thread.start()
        built.result()
        self.engine.platform.place_frontend_thread()

    # -- asyncio side --------------------------------------------------------------------
    @property
    def is_running(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def stats(self) -> dict[str, Any]:
        """A snapshot of the engine's counters, taken after its last step, with the requests
        :meth:`add_request` has not yet handed to the engine counted as waiting. Each request is
        counted once at most: by this count until the engine thread takes it in, by the
        snapshot after the next refresh (in between, by neither)."""
        stats = dict(self._stats)  # the snapshot first: a request taken in after it is still in _adding
        stats["num_waiting"] = stats.get("num_waiting", 0) + self._adding
        return stats

    def _call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        if not self.is_running:
            raise EngineDeadError("the engine is not running")
        future: concurrent.futures.Future = concurrent.futures.Future()

        def command() -> None:
            if not future.set_running_or_notify_cancel():
                return  # the caller gave up (cancelled) before the engine got to it
            if self.failure is not None:
                future.set_exception(EngineDeadError(str(self.failure)))
                return
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, not raised in the engine thread
                future.set_exception(exc)

        self._commands.put(command)
        self._wake.set()
        return future

    async def add_request(
        self,
        request_id: str,
        params: SamplingParams,
        prompt: str | None = None,
        prompt_token_ids: list[int] | None = None,
        priority: int = 0,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
    ) -> RequestStream:
        """Add a request; return its stream of (cumulative) outputs once the engine took it in.

        :param arrival_time: when the request arrived (``time.time()``); default: now, when
            ``add_request`` is called, not when the engine thread takes it in.
        :raises ValueError: the engine rejected the request (nothing was streamed yet).
        """
        arrival = time.time() if arrival_time is None else arrival_time
        outputs: asyncio.Queue = asyncio.Queue()

        ran = []

        def take_in() -> None:  # on the engine thread
            ran.append(True)
            self._count_adding(-1)
            self.engine.add_request(
                request_id, prompt, params, prompt_token_ids, arrival_time=arrival, priority=priority,
                lora_request=lora_request,
            )  # fmt: skip

        self._count_adding(1)
        try:
            future = self._call(take_in)
        except BaseException:
            self._count_adding(-1)
            raise
        self._streams[request_id] = (asyncio.get_running_loop(), outputs)
        try:
            await asyncio.wrap_future(future)
        except BaseException:
            if future.cancelled() or (future.done() and not ran):  # take_in never ran (a dead engine skips it)
                self._count_adding(-1)
            self._streams.pop(request_id, None)
            raise
        return RequestStream(self, request_id, outputs)

    def _count_adding(self, change: int) -> None:
        with self._adding_lock:
            self._adding += change

    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Load a LoRA adapter on the engine thread; ValueError when it cannot be used."""
        await asyncio.wrap_future(self._call(lambda: self.engine.add_lora(lora_request)))

    async def remove_lora(self, lora_int_id: int) -> bool:
        """Unload a LoRA adapter on the engine thread; False when it was not loaded."""
        return await asyncio.wrap_future(self._call(lambda: self.engine.remove_lora(lora_int_id)))

    def _close_stream(self, request_id: str, is_finished: bool) -> None:
        self._streams.pop(request_id, None)
        if not is_finished and self.is_running:
            self._call(lambda: self.engine.abort_request(request_id))

    async def abort(self, request_id: str) -> None:
        """Abort a request (no-op when it is unknown or done)."""
        await asyncio.wrap_future(self._call(lambda: self.engine.abort_request(request_id)))

    def shutdown(self, timeout: float = 10.0) -> None:
        """Abort what is in flight and stop the engine thread."""
        if not self._thread.is_alive():
            return

        def abort_all() -> None:
            for request_id in list(self.engine.requests):
                self._deliver(self.engine.abort_request(request_id))
            self._stop.set()

        self._commands.put(abort_all)
        self._wake.set()
        self._thread.join(timeout)

    # -- engine thread ---------------------------------------------------------------------
    def _deliver(self, out: RequestOutput | BaseException | None, request_id: str | None = None) -> None:
        if out is None:
            return
        stream = self._streams.get(request_id or out.request_id)
        if stream is not None:
            loop, outputs = stream
            loop.call_soon_threadsafe(outputs.put_nowait, out)

    def _fail(self, exc: WorkerFailed) -> None:
        """Stop for good after a worker failed: end every stream (its workers are already stopped)."""
        logger.error("%s; the engine stops", exc)
        self.failure = exc
        self._stop.set()
        for request_id in list(self._streams):
            self._deliver(EngineDeadError(str(exc)), request_id)
        self._run_commands()  # commands already queued fail with the same error

    def _run(self, build: Callable[[], LLMEngine], built: concurrent.futures.Future) -> None:
        try:
            self.engine = build()
            self._stats = self.engine.stats()
        except BaseException as exc:  # handed to the constructor's caller
            built.set_exception(exc)
            return
        built.set_result(None)
        try:
            self._serve()
        finally:
            self.engine.shutdown()  # its workers, when the model is split

    def _run_commands(self) -> None:
        """The step boundary: everything queued (requests admitted during the step, aborts) in order.

        The stats snapshot is refreshed after them, so a request the front end saw accepted is
        counted by the engine's gauges from then on (and by :meth:`stats`' count of the requests
        not yet taken in until its command ran).
        """
        num_run = 0
        while True:
            try:
                self._commands.get_nowait()()
            except queue.Empty:
                break
            num_run += 1
        if num_run and self.failure is None:
            self._stats = self.engine.stats()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self._run_commands()
            if self._stop.is_set():
                break
            try:
                if not self.engine.has_unfinished_requests():
                    self._stats = self.engine.stats()
                    if not self._wake.wait(HEALTH_CHECK_INTERVAL_S):
                        self.engine.check_health()
                    self._wake.clear()
                    continue
                outputs = self.engine.step()
            except WorkerFailed as exc:
                self._fail(exc)
                return
            except Exception as exc:  # fail the requests in flight, keep serving the next ones
                logger.exception("engine step failed; aborting the requests in flight")
                for request_id in list(self.engine.requests):
                    self.engine.abort_request(request_id)
                    self._deliver(RuntimeError(f"engine step failed: {exc}"), request_id)
                continue
            self._stats = self.engine.stats()  # before delivering: a client that saw a token sees its request counted
            for out in outputs:
                self._deliver(out)


class RequestStream:
    """One admitted request's outputs, as an async iterator; :meth:`aclose` before its end aborts it."""

    def __init__(self, engine: AsyncEngine, request_id: str, outputs: asyncio.Queue) -> None:
        self.engine = engine
        self.request_id = request_id
        self._outputs = outputs
        self.is_finished = False
        self._is_closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.is_finished or self._is_closed:
            raise StopAsyncIteration
        item = await self._outputs.get()
        if isinstance(item, BaseException):  # the engine already dropped the request
            self.is_finished = True
            raise item
        self.is_finished = item.finished
        return item

    def close(self) -> None:
        """Stop streaming; abort the request if it has not finished. Idempotent."""
        if not self._is_closed:
            self._is_closed = True
            self.engine._close_stream(self.request_id, self.is_finished)

    async def aclose(self) -> None:
        self.close()
