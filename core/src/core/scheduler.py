"""Continuous-batching scheduler: a token budget per step, chunked prefill, preemption.

One step (``schedule``) picks, within ``max_num_batched_tokens`` new tokens:

1. every decoding sequence (its prompt computed: one token), highest priority first;
2. then prefill chunks in (priority, arrival) order: running sequences whose prompt is
   partly computed take the next chunk of what is left of the budget, then waiting
   sequences are admitted while blocks, budget and ``max_num_seqs`` allow (no
   overtaking). A sequence taking its first blocks reuses its longest cached prefix.

So a burst is prefilled oldest first (its first requests start decoding while the later
ones are still waiting), and the bound on decode stalls is the budget: a running decode
gets a token in every step that does not preempt it, and a step carries at most
``max_num_batched_tokens`` tokens, so a long prompt delays a decode by at most one
budget's worth of prefill per token. When KV blocks run out, the lowest-priority, latest
sequence not yet scheduled in the step is preempted by recompute: its blocks are freed,
``num_computed_tokens`` goes back to 0 and it returns to the waiting queue, ahead of later
arrivals of its priority. Nothing is admitted in a step that preempted.

The engine runs the model on the scheduled tokens, samples one token for each sequence
that reached its end, and calls ``update``. A step with speculative drafts
(``schedule(drafts)``) schedules a speculating decode as its last token plus its drafts,
with KV slots reserved for all of them; the engine then appends each sequence's accepted
run and calls ``advance``, which rolls the computed length back over rejected drafts.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass, field

from core.block_manager import BlockManager
from core.sequence import Sequence, SequenceStatus, check_length

logger = logging.getLogger(__name__)


def _order(seq: Sequence) -> tuple[int, float, int]:
    """Scheduling order: lower priority value first, then earlier arrival."""
    return (seq.priority, seq.arrival_time, seq.seq_id)


@dataclass
class ScheduledSeq:
    """A sequence's share of one step.

    Its new tokens are ``seq.token_ids[start_pos : start_pos + num_new_tokens]`` at
    positions ``start_pos ...``, then its ``draft_token_ids`` (a speculating decode: the
    last token and k drafts, ``num_new_tokens`` = k + 1); ``needs_sample`` says whether the
    step must produce a token for it (it reaches ``seq.num_tokens``). All are fixed when it
    is scheduled, but for a draft model's drafts: their slots are reserved here and the draft
    tokens written into ``draft_token_ids`` before the step runs
    (:class:`core.spec_decode.draft_model.DraftModel`).
    """

    seq: Sequence
    num_new_tokens: int
    draft_token_ids: list[int] | tuple[()] = ()
    start_pos: int = field(init=False)
    needs_sample: bool = field(init=False)

    def __post_init__(self) -> None:
        self.start_pos = self.seq.num_computed_tokens
        self.needs_sample = self.start_pos + self.num_new_tokens - len(self.draft_token_ids) == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """What one step computes: the scheduled sequences and those preempted to make room."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        """New tokens in this step."""
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """True when nothing was scheduled."""
        return not self.scheduled


class Scheduler:
    """Decides which tokens of which sequences each engine step computes.

    :param block_manager: owns the KV blocks.
    :param max_num_seqs: most sequences running at once.
    :param max_num_batched_tokens: most new tokens per step.
    :param max_model_len: most tokens (prompt + output) per sequence.
    :param enable_chunked_prefill: split prompts longer than the step's remaining budget.
    :param kv_window: the attention window every layer of the model keeps within (None when
        some layer sees the whole context): blocks older than it are given back as sequences grow.
    :param max_loras: most distinct LoRA adapters among running sequences (None: no limit):
        a waiting sequence whose adapter would exceed it waits (and, in order, those behind it).
    """

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        enable_chunked_prefill: bool = True,
        kv_window: int | None = None,
        max_loras: int | None = None,
    ) -> None:
        for name, value in (
            ("max_num_seqs", max_num_seqs),
            ("max_num_batched_tokens", max_num_batched_tokens),
            ("max_model_len", max_model_len),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs})"
            )
        if not enable_chunked_prefill and max_num_batched_tokens < max_model_len:
            raise ValueError(
                f"Without chunked prefill max_num_batched_tokens ({max_num_batched_tokens}) must be "
                f">= max_model_len ({max_model_len}), or no long prompt could ever run"
            )
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv_window = kv_window
        self.max_loras = max_loras
        self.enable_chunked_prefill = enable_chunked_prefill
        self._waiting: list[Sequence] = []  # kept sorted by _order
        self._running: list[Sequence] = []  # kept sorted by _order; the last is preempted first
        self.num_preemptions = 0  # total so far, for metrics

    @property
    def num_running(self) -> int:
        """Sequences holding KV blocks (decoding or partly prefilled)."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Sequences waiting for their first (or, after preemption, next) admission."""
        return len(self._waiting)

    def has_unfinished(self) -> bool:
        """True while any sequence is waiting or running."""
        return bool(self._waiting or self._running)

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens fits both max_model_len and the whole cache."""
        return num_tokens <= self.max_model_len and self.block_manager.can_ever_fit(num_tokens)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. Raises ValueError when its prompt can never run."""
        if seq.status is not SequenceStatus.WAITING:
            raise ValueError(f"Sequence {seq.seq_id} is {seq.status.name}, expected WAITING")
        check_length(seq.num_prompt_tokens, 0, self.max_model_len)
        if not self.block_manager.can_ever_fit(seq.num_prompt_tokens):
            bm = self.block_manager
            raise ValueError(
                f"Request {seq.request_id!r}: prompt of {seq.num_prompt_tokens} tokens needs "
                f"{bm.num_blocks_for(seq.num_prompt_tokens)} KV blocks, the cache has {bm.num_total_blocks}"
            )
        bisect.insort(self._waiting, seq, key=_order)

    def decoding(self) -> list[Sequence]:
        """Running sequences whose next step computes one token (their last): those that may speculate."""
        return [seq for seq in self._running if seq.num_tokens - seq.num_computed_tokens == 1]

    def schedule(self, drafts: dict[int, list[int]] | None = None) -> SchedulerOutput:
        """Pick this step's tokens and allocate their blocks. Call ``update`` (or ``advance``) after each.

        :param drafts: seq_id -> draft tokens of decoding sequences that speculate: each is
            scheduled with its drafts when the budget and KV blocks allow (KV slots reserved
            for all of them), else without (speculation never preempts anyone).
        """
        out = SchedulerOutput()
        budget = self._schedule_running(self.max_num_batched_tokens, out, drafts)
        if not out.preempted:
            self._schedule_waiting(budget, out)
        return out

    def update(self, output: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """Record that ``output``'s tokens were computed and append the sampled tokens.

        :param sampled: seq_id -> token for every scheduled sequence with
            ``needs_sample``; entries for other sequences are ignored.
        :returns: the sequences that received a token. Nothing is finished here: the engine
            decides (:meth:`core.request_state.RequestState.record_token`), asking
            :meth:`is_capped` for the limits only the scheduler knows.
        """
        advanced: list[Sequence] = []
        for item in output.scheduled:
            seq = item.seq
            if seq.is_finished or not item.needs_sample:  # aborted after it was scheduled; a prompt chunk
                continue
            if seq.seq_id not in sampled:
                raise KeyError(f"No sampled token for sequence {seq.seq_id} (request {seq.request_id!r})")
            seq.append_token(sampled[seq.seq_id])
            advanced.append(seq)
        self.advance(output)
        return advanced

    def advance(self, output: SchedulerOutput) -> None:
        """Record that ``output``'s tokens were computed, its sampled tokens already appended
        (a speculative step: the engine appends each run token by token, up to a stop).

        A sequence that sampled keeps the KV of every position but its new last token: the
        slots of rejected drafts are rolled back, to be overwritten by the next step.
        """
        for item in output.scheduled:
            seq = item.seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens = seq.num_tokens - 1 if item.needs_sample else item.start_pos + item.num_new_tokens
            self.block_manager.cache_blocks(seq)  # computed positions only: never a rejected draft's
            if self.kv_window is not None:  # the next query, at num_computed_tokens, sees keys from here on
                self.block_manager.free_before(seq, seq.num_computed_tokens - self.kv_window + 1)

    def finish(self, seq: Sequence, status: SequenceStatus) -> None:
        """End ``seq`` with a ``FINISHED_*`` status and free its blocks.

        A sequence that is already finished keeps its first status.
        """
        if not status.is_finished:
            raise ValueError(f"finish() needs a FINISHED_* status, got {status.name}")
        if seq.is_finished:
            return
        queue = self._running if seq.status is SequenceStatus.RUNNING else self._waiting
        queue.remove(seq)
        self.block_manager.free(seq)
        seq.status = status

    def abort(self, request_id: str) -> list[Sequence]:
        """Abort every live sequence of ``request_id``; returns them (empty if none)."""
        seqs = [s for s in (*self._running, *self._waiting) if s.request_id == request_id]
        for seq in seqs:
            self.finish(seq, SequenceStatus.FINISHED_ABORTED)
        return seqs

    def is_capped(self, seq: Sequence) -> bool:
        """True when ``seq`` may not grow: max_model_len reached, or its next step would need more than the cache."""
        return seq.num_tokens >= self.max_model_len or not self.block_manager.can_ever_fit(seq.num_tokens)

    # ---- internals ------------------------------------------------------------------

    def _schedule_running(self, budget: int, out: SchedulerOutput, drafts: dict[int, list[int]] | None) -> int:
        """Schedule running sequences, decodes first, preempting from the back; returns the budget left."""
        decoding = self.decoding()
        prefilling = [seq for seq in self._running if seq.num_tokens - seq.num_computed_tokens > 1]
        scheduled: set[int] = set()
        for seq in (*decoding, *prefilling):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted to make room for one before it
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            num_tokens = seq.num_computed_tokens + num_new
            draft = drafts.get(seq.seq_id) if drafts else None
            if draft:
                draft = draft[: budget - num_new]
                if draft and self.block_manager.can_allocate(seq, num_tokens + len(draft)):
                    self.block_manager.allocate(seq, num_tokens + len(draft))
                    out.scheduled.append(ScheduledSeq(seq, num_new + len(draft), draft))
                    scheduled.add(seq.seq_id)
                    budget -= num_new + len(draft)
                    continue
            if self.block_manager.holds(seq, num_tokens):  # most decode steps: no new block, nothing to check
                out.scheduled.append(ScheduledSeq(seq, num_new))
                scheduled.add(seq.seq_id)
                budget -= num_new
                continue
            while not self.block_manager.can_allocate(seq, num_tokens):
                # the latest sequence not scheduled in this step (``seq`` itself at the latest)
                victim = next(s for s in reversed(self._running) if s.seq_id not in scheduled)
                self._running.remove(victim)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    return budget
            self.block_manager.allocate(seq, num_tokens)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            scheduled.add(seq.seq_id)
            budget -= num_new
        return budget

    def _schedule_waiting(self, budget: int, out: SchedulerOutput) -> None:
        """Admit waiting sequences in order until one does not fit (no overtaking)."""
        bm = self.block_manager
        # running sequences never span more than max_loras adapters, so each step can run them all
        loras = None if self.max_loras is None else {s.lora.lora_int_id for s in self._running if s.lora}
        while self._waiting and budget > 0 and len(self._running) < self.max_num_seqs:
            seq = self._waiting[0]
            if loras is not None and seq.lora is not None and seq.lora.lora_int_id not in loras:
                if len(loras) >= self.max_loras:
                    return
                loras.add(seq.lora.lora_int_id)
            num_cached = bm.match_prefix(seq)
            num_left = seq.num_tokens - num_cached
            num_new = min(num_left, budget)
            if num_new < num_left and not self.enable_chunked_prefill:
                return
            if not bm.can_allocate(seq, num_cached + num_new):
                return
            self._waiting.pop(0)
            bm.allocate(seq, num_cached + num_new)  # sets num_computed_tokens to num_cached
            seq.status = SequenceStatus.RUNNING
            bisect.insort(self._running, seq, key=_order)
            out.scheduled.append(ScheduledSeq(seq, num_new))
            budget -= num_new

    def _preempt(self, seq: Sequence) -> None:
        """Free ``seq``'s blocks and requeue it to recompute prompt + output later."""
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_cached_tokens = 0
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        bisect.insort(self._waiting, seq, key=_order)
        logger.debug("preempted sequence %d (request %r): KV cache full", seq.seq_id, seq.request_id)
