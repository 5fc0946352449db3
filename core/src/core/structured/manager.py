"""The engine's structured outputs: grammars compiled once, a matcher a sequence, a bitmask a step."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from core.structured.backends import Backend, Matcher, make_backend
from core.structured.params import StructuredOutputsParams
from core.structured.reasoning import END, START, ReasoningGate, get_reasoning_parser

#: compiled grammars kept (least recently used dropped first)
CACHE_SIZE = 256


class StructuredOutputs:
    """Compiles constraints (thread-safe, cached by :attr:`StructuredOutputsParams.key`) and
    turns the step's matchers into one packed bitmask.

    The backend (its tokenizer tables take about a second to build) is made at the first
    constrained request, not at start-up.
    """

    def __init__(
        self,
        backend: str,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        reasoning_parser: str | None = None,
    ) -> None:
        """:param reasoning_parser: when set, constraints apply after the answer's reasoning
        (:class:`~core.structured.reasoning.ReasoningGate`)."""
        self.reasoning = get_reasoning_parser(reasoning_parser) if reasoning_parser else None
        self.backend_name = backend
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._backend: Backend | None = None
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._worker: ThreadPoolExecutor | None = None  # made by the engine thread: it inherits its CPUs

    def _get_backend(self) -> Backend:
        with self._lock:
            if self._backend is None:
                if self.tokenizer is None:
                    raise ValueError("structured outputs need the model's tokenizer (this engine has none)")
                self._backend = make_backend(self.backend_name, self.tokenizer, self.vocab_size, self.eos_token_ids)
            return self._backend

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar of ``spec``; ``ValueError`` (with the backend's message) when it is not valid."""
        backend = self._get_backend()
        with self._lock:
            if spec.key in self._cache:
                self._cache.move_to_end(spec.key)
                return self._cache[spec.key]
        grammar = backend.compile(spec)  # outside the lock: compiles of different specs run side by side
        with self._lock:
            self._cache[spec.key] = grammar
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def matcher(self, spec: StructuredOutputsParams) -> Matcher:
        """A matcher at the start of ``spec``'s grammar, for one sequence (after its reasoning, if any)."""
        matcher = self._get_backend().matcher(self.compile(spec))
        if self.reasoning is None:
            return matcher
        return ReasoningGate(matcher, self.reasoning, *self._reasoning_tags)

    @functools.cached_property
    def _reasoning_tags(self) -> tuple[list[int], list[int]]:
        """The token ids of ``<think>`` and ``</think>``, tokenized once."""
        return tuple(self.tokenizer.encode(tag, add_special_tokens=False) for tag in (START, END))

    def bitmask(
        self, matchers: Sequence[Matcher | None], runs: dict[int, Sequence[int]] | None = None
    ) -> tuple[torch.Tensor, list[int]] | None:
        """The packed int32 bitmask [R, ceil(V / 32)] of the R rows that have a matcher, and those rows; None if none.

        :param runs: first row -> drafts of a speculative run: its ``len(drafts) + 1`` rows share
            the first row's matcher, and row ``j`` of the run is masked as after the first ``j``
            drafts (:func:`fill_run`; the matcher is back where it was when this returns).
        """
        rows = [i for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        bitmask = torch.empty((len(rows), (self.vocab_size + 31) // 32), dtype=torch.int32)
        index = {i: j for j, i in enumerate(rows)}
        runs = {first: drafts for first, drafts in (runs or {}).items() if matchers[first] is not None}
        in_runs = {row for first, drafts in runs.items() for row in range(first, first + len(drafts) + 1)}
        pending = [(matchers[i], index[i]) for i in rows if i not in in_runs]
        fill_rows = getattr(self._backend, "fill_bitmask_rows", None)
        if fill_rows is not None:
            pending = fill_rows(pending, bitmask)
        for matcher, j in pending:
            matcher.fill_bitmask(bitmask, j)  # type: ignore[union-attr]
        for first, drafts in runs.items():
            fill_run(matchers[first], list(drafts), bitmask, index[first])  # type: ignore[arg-type]
        return bitmask, rows

    def bitmask_soon(
        self, matchers: Sequence[Matcher | None], runs: dict[int, Sequence[int]] | None = None
    ) -> Future | None:
        """:meth:`bitmask` on a worker thread (the future of its result); None when no row has a
        matcher. The matchers must not advance until the result is taken."""
        if all(m is None for m in matchers):
            return None
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="core-grammar")
        return self._worker.submit(self.bitmask, matchers, runs)

    def shutdown(self) -> None:
        """Stop the worker thread (after its fill in progress, if any)."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None


def fill_run(matcher: Matcher, drafts: list[int], bitmask: torch.Tensor, row: int) -> None:
    """Mask the ``len(drafts) + 1`` rows of a speculative run from ``bitmask[row]`` on: row ``j``
    as after the first ``j`` drafts (accepted one by one, then rolled back). Rows after a draft
    the grammar refuses (or after its end) repeat the row before: they are never used, as that
    row's mask rejects the draft."""
    valid = matcher.validate(drafts)
    matcher.fill_bitmask(bitmask, row)
    last = row  # the last row filled
    consumed = 0
    for token in drafts[:valid]:
        matcher.accept(token)
        consumed += 1
        if matcher.is_terminated():  # the grammar ended at this draft: the sequence stops there
            break
        last = row + consumed
        matcher.fill_bitmask(bitmask, last)
    bitmask[last + 1 : row + len(drafts) + 1] = bitmask[last]
    if consumed:
        matcher.rollback(consumed)
