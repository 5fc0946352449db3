"""Chat templates rendered within budgets: the server's own in-process, a request's in a sandbox process.

A server-side template (the model's, or ``core serve --chat-template``) is the operator's code:
it renders on the front end's tokenizer threads and only its output size is capped. A request's
``chat_template`` is a stranger's code. The server refuses it unless started with
``--trust-request-chat-template``, and even then renders it in a separate worker process
(:class:`TemplateSandbox`) under three budgets: wall time (past it the process is killed, so the
work is abandoned rather than left running), memory (the worker's data segment is capped, so a
``{{ 'x' * 10**9 }}`` fails inside it) and output size. Other requests never wait behind such a
render: they use the model's template on their own threads.

Both paths render with transformers' ``render_jinja_template`` (its sandboxed Jinja environment
and variables), with the tokenizer's special tokens as template variables, as
``tokenizer.apply_chat_template`` does.

Run as ``python -m core.server.chat_templates MEMORY_BYTES MAX_OUTPUT_BYTES`` this module is the
worker: one JSON request a line on stdin, one JSON answer a line on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import resource
import sys
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

READY = b"ready\n"  # a worker's first line

#: variables a render sets itself: ``chat_template_kwargs`` may not replace them
RESERVED_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "documents", "chat_template"})


class TemplateError(ValueError):
    """A chat template that failed, or went past a budget, on a request's messages (HTTP 400)."""


@dataclass(frozen=True)
class TemplateBudget:
    """What one render may take.

    :param timeout_s: wall time of a request template's render (the sandbox kills it past this).
    :param max_output_bytes: the rendered text's size in UTF-8 bytes, for every template.
    :param memory_bytes: the sandbox worker's heap growth allowed for one render.
    """

    timeout_s: float = 2.0
    max_output_bytes: int = 16 << 20
    memory_bytes: int = 512 << 20


def render(
    template: str, messages: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any]
) -> str:
    """The text of ``messages`` under ``template`` (transformers' sandboxed Jinja environment).

    :param variables: the template's other variables: the tokenizer's special tokens, then the
        request's ``chat_template_kwargs``.
    """
    from transformers.utils.chat_template_utils import render_jinja_template

    (text,), _ = render_jinja_template(
        [messages], chat_template=template, add_generation_prompt=add_generation_prompt, **variables
    )
    return text


def check_output(text: str, max_bytes: int) -> str:
    """``text``, or :class:`TemplateError` when its UTF-8 size is past ``max_bytes``."""
    # a str's length bounds its UTF-8 size from below and 4x from above: encode only in between
    if len(text) > max_bytes or (4 * len(text) > max_bytes and len(text.encode("utf-8", "surrogatepass")) > max_bytes):
        raise TemplateError(
            f"the chat template's output is larger than the server's budget of {max_bytes} bytes "
            "(core serve --chat-template-max-bytes)"
        )
    return text


class TemplateSandbox:
    """A few worker processes that render request-supplied chat templates under a :class:`TemplateBudget`.

    Renders queue for a free worker (only requests that bring their own template ever wait
    here); a worker past its time budget is killed and replaced.
    """

    def __init__(self, budget: TemplateBudget, num_workers: int = 2) -> None:
        self.budget = budget
        self.num_workers = num_workers
        self._idle: asyncio.Queue[asyncio.subprocess.Process] | None = None
        self._spawning: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Start the workers (a first render would start them too, paying their start-up)."""
        if self._idle is None:
            self._idle = asyncio.Queue()
            for _ in range(self.num_workers):
                self._idle.put_nowait(await self._spawn())

    async def close(self) -> None:
        """Stop every worker."""
        for task in self._spawning:
            task.cancel()
        while self._idle is not None and not self._idle.empty():
            await _kill(self._idle.get_nowait())

    async def _spawn(self) -> asyncio.subprocess.Process:
        """A new worker, once it is ready (its imports are not part of any render's time)."""
        worker = await asyncio.create_subprocess_exec(
            sys.executable, "-m", __name__, str(self.budget.memory_bytes), str(self.budget.max_output_bytes),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=4 * self.budget.max_output_bytes + (1 << 16),  # one answer line: the text JSON-escaped
        )  # fmt: skip
        assert worker.stdout is not None
        if await worker.stdout.readline() != READY:
            await _kill(worker)
            raise RuntimeError("a chat template worker process failed to start")
        return worker

    def _replace(self) -> None:
        """Start a worker in the background in place of a killed one."""

        async def spawn() -> None:
            assert self._idle is not None
            self._idle.put_nowait(await self._spawn())

        task = asyncio.ensure_future(spawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    async def render(
        self, template: str, messages: list[dict[str, Any]], add_generation_prompt: bool, variables: dict[str, Any]
    ) -> str:
        """:func:`render` in a worker, within the budget; :class:`TemplateError` when it fails or goes past it."""
        await self.start()
        assert self._idle is not None
        line = json.dumps([template, messages, add_generation_prompt, variables]).encode() + b"\n"
        worker = await self._idle.get()
        healthy = False
        try:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(line)
            await worker.stdin.drain()
            answer = await asyncio.wait_for(worker.stdout.readline(), self.budget.timeout_s)
            if not answer:
                raise TemplateError("the chat template's render ended its worker process")
            healthy = True
        except TimeoutError:
            raise TemplateError(
                f"the chat template did not finish rendering within the server's budget of "
                f"{self.budget.timeout_s:g} s (core serve --chat-template-timeout); it was stopped"
            ) from None
        except (ConnectionError, ValueError) as exc:  # a broken pipe; a line past the reader's limit
            raise TemplateError(f"the chat template's render failed: {exc}") from None
        finally:
            if healthy:
                self._idle.put_nowait(worker)
            else:
                await _kill(worker)
                self._replace()
        kind, value = json.loads(answer)
        if kind != "ok":
            raise TemplateError(value)
        return value


async def _kill(worker: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        worker.kill()
    await worker.wait()


def _data_bytes() -> int:
    """This process's data segment (what RLIMIT_DATA counts), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def _answer(request: list[Any], max_output_bytes: int) -> list[str]:
    template, messages, add_generation_prompt, variables = request
    try:
        return ["ok", check_output(render(template, messages, add_generation_prompt, variables), max_output_bytes)]
    except MemoryError:
        return ["error", "the chat template went past the server's memory budget for a render"]
    except TemplateError as exc:
        return ["error", str(exc)]
    except Exception as exc:  # the template's own errors: raise_exception, syntax, sandbox refusals
        return ["error", f"the chat template failed on these messages: {type(exc).__name__}: {exc}"]


def _worker(memory_bytes: int, max_output_bytes: int) -> None:
    import transformers.utils.chat_template_utils  # noqa: F401  (before the cap: imports are not the render's)

    soft = _data_bytes() + memory_bytes
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    for line in sys.stdin.buffer:
        answer = _answer(json.loads(line), max_output_bytes)
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _worker(int(sys.argv[1]), int(sys.argv[2]))
