"""Draft-model proposals: a smaller model with the target's vocabulary drafts k tokens, one forward each.

The draft model runs on the same platform as the target, in the same worker, with its own
:class:`core.model_runner.ModelRunner` (its own platform runner and KV cache). Its cache has
the target's block count and block size and is indexed by the target's block tables: the
draft's KV of position ``p`` of a sequence lives in the slot the target's does, so the
scheduler's block allocation (lookahead slots included) serves both.

The draft catches up lazily: for each sequence it remembers how many leading positions its
cache holds right (``_valid``) and which tokens it wrote after them (``_tail``, its own
drafts). At the next proposal, the drafts the target accepted are confirmed, and the first
forward feeds every position from the first unconfirmed one to the sequence's last token
(the whole prompt the first time; usually the bonus token, or the last draft and the bonus
token, after that), in chunks of at most ``max_num_batched_tokens``. Each of the ``k - 1``
forwards after it feeds one draft. A sequence the scheduler preempted leaves the decoding
set and is forgotten (:meth:`DraftModel.keep`): its blocks are freed, so its draft KV is
recomputed when it is back. A prefix-cache hit is recomputed too (the draft cannot know
whether another sequence wrote those blocks' draft KV), writing the values already there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import torch
from plugins import EngineConfigView, Platform

from core.loader import LoadedModel, load_model
from core.model_runner import ModelRunner, StepBatch
from core.sampler import Sampler, SamplingState
from core.scheduler import ScheduledSeq
from core.sequence import Sequence
from core.structured.backends import Matcher

#: what a draft slot holds from scheduling until :meth:`DraftModel.propose` writes the draft
PENDING = -1


class DraftModel:
    """Draws drafts from a draft model for scheduled sequences, and keeps its KV cache in step.

    :param runner: the draft's model runner, KV cache allocated and bound (same block size and
        count as the target's).
    :param sampler: draws each draft with the sequence's sampling params (the draft's own
        distribution, kept for the rejection sampler).
    :param max_num_batched_tokens: most tokens one draft forward takes.
    """

    def __init__(self, runner: ModelRunner, sampler: Sampler, max_num_batched_tokens: int) -> None:
        self.runner = runner
        self.sampler = sampler
        self.max_num_batched_tokens = max_num_batched_tokens
        self._valid: dict[int, int] = {}  # seq_id -> leading positions whose draft KV is right
        self._tail: dict[int, list[int]] = {}  # seq_id -> tokens the draft fed after them (its drafts)

    def keep(self, seq_ids: Iterable[int]) -> None:
        """Forget every sequence but ``seq_ids`` (the decoding ones): finished or preempted ones."""
        keep = set(seq_ids)
        self._valid = {s: n for s, n in self._valid.items() if s in keep}
        self._tail = {s: t for s, t in self._tail.items() if s in keep}

    def propose(
        self,
        scheduled: list[ScheduledSeq],
        sampling_state: Callable[[Sequence, list[int]], SamplingState],
        matcher: Callable[[Sequence], Matcher | None],
        constrain: Callable[[torch.Tensor, list[Matcher | None]], None],
    ) -> dict[int, torch.Tensor]:
        """Write the drafts of every item with :data:`PENDING` draft slots into them, in place.

        A sequence with a grammar draws each draft under its grammar's mask: its matcher
        accepts the drafts one by one and is rolled back over them at the end.

        :param sampling_state: the sampling state of a sequence's next token after the given
            output (its output so far, then the drafts before it).
        :param matcher: a sequence's grammar matcher (None without one).
        :param constrain: masks rows of logits to what their matchers allow now.
        :returns: seq_id -> ``[k, V]`` distributions the drafts were drawn from, for sequences
            that sample at random (greedy drafts are each row's argmax: the target's own
            argmax verifies them).
        """
        items = [item for item in scheduled if item.draft_token_ids and item.draft_token_ids[0] == PENDING]
        if not items:
            return {}
        seqs = [item.seq for item in items]
        for seq in seqs:  # confirm what the target accepted of the last drafts
            valid, tail = self._valid.get(seq.seq_id, 0), self._tail.get(seq.seq_id, [])
            tokens = seq.token_ids
            n = 0
            while n < len(tail) and valid + n < seq.num_tokens - 1 and tail[n] == tokens[valid + n]:
                n += 1
            self._valid[seq.seq_id] = valid + n
        logits = self._catch_up(seqs)
        outputs = [list(seq.output_token_ids) for seq in seqs]
        random = {i for i, seq in enumerate(seqs) if not seq.params.is_greedy}
        probs: dict[int, list[torch.Tensor]] = {seqs[i].seq_id: [] for i in random}
        matchers = [matcher(seq) for seq in seqs]
        consumed = [0] * len(items)  # drafts each matcher accepted
        active = list(range(len(items)))  # indices of items still drafting
        for j in range(max(len(item.draft_token_ids) for item in items)):
            if j:  # feed each active item's previous draft
                logits = self._forward([(seqs[i], seqs[i].num_tokens + j - 1, [outputs[i][-1]]) for i in active])
            # a matcher that ended (or refused a draft) masks no more: the drafts after are never kept
            live = [matchers[i] if consumed[i] == j and _open(matchers[i]) else None for i in active]
            if any(m is not None for m in live):
                constrain(logits, live)
            out = self.sampler(logits, [sampling_state(seqs[i], outputs[i]) for i in active], keep_probs=True)
            for row, i in enumerate(active):
                token = out.token_ids[row]
                items[i].draft_token_ids[j] = token
                outputs[i].append(token)
                if i in random:
                    probs[seqs[i].seq_id].append(out.probs[row])
                if live[row] is not None and live[row].validate([token]) == 1:
                    live[row].accept(token)
                    consumed[i] += 1
            active = [i for i in active if len(items[i].draft_token_ids) > j + 1]
        for m, n in zip(matchers, consumed, strict=True):
            if n:
                m.rollback(n)
        for seq, item in zip(seqs, items, strict=True):
            self._valid[seq.seq_id] = seq.num_tokens
            self._tail[seq.seq_id] = list(item.draft_token_ids[:-1])
        return {seq_id: torch.stack(rows) for seq_id, rows in probs.items()}

    def _catch_up(self, seqs: list[Sequence]) -> torch.Tensor:
        """Feed each sequence from its first unconfirmed position to its last token, in forwards
        of at most ``max_num_batched_tokens``; the logits of each one's last position, in order."""
        pending = [(seq, self._valid[seq.seq_id]) for seq in seqs]
        last_rows: dict[int, torch.Tensor] = {}
        while pending:
            rows, budget, left = [], self.max_num_batched_tokens, []
            for seq, start in pending:
                take = min(seq.num_tokens - start, budget)
                if take > 0:
                    rows.append((seq, start, seq.token_ids[start : start + take]))
                    budget -= take
                if start + take < seq.num_tokens:
                    left.append((seq, start + take))
            done = [seq for seq, start, tokens in rows if start + len(tokens) == seq.num_tokens]
            logits = self._forward(rows, sample=[seq.seq_id for seq in done])
            last_rows.update(zip([seq.seq_id for seq in done], logits, strict=True))
            pending = left
        return torch.stack([last_rows[seq.seq_id] for seq in seqs])

    def _forward(self, rows: list[tuple[Sequence, int, list[int]]], sample: list[int] | None = None) -> torch.Tensor:
        """One draft forward of ``(seq, first position, tokens)`` rows; the logits of the last
        token of each row (of the rows of ``sample``'s seq_ids, when given)."""
        ids: list[int] = []
        positions: list[int] = []
        query_lens, seq_lens, tables, sample_rows, sample_ids = [], [], [], [], []
        for seq, start, tokens in rows:
            ids.extend(tokens)
            positions.extend(range(start, start + len(tokens)))
            query_lens.append(len(tokens))
            seq_lens.append(start + len(tokens))
            tables.append(seq.block_table)
            if sample is None or seq.seq_id in sample:
                sample_rows.append(len(ids) - 1)
                sample_ids.append(seq.seq_id)
        batch = StepBatch(ids, positions, query_lens, seq_lens, tables, sample_rows, sample_ids, {})
        return self.runner.run(batch).sample_logits


def load_draft(platform: Platform, config: EngineConfigView, model: str, target: LoadedModel) -> ModelRunner:
    """Load the draft model ``model`` on ``platform`` beside ``target``, with a runner of its own.

    :raises ValueError: one line naming the problem: the draft cannot be loaded, its
        vocabulary differs from the target's, it is shorter than ``max_model_len``, or either
        model drops KV blocks behind a sliding window (the draft reads the target's block tables).
    """
    try:
        draft = load_model(
            model,
            kernels=platform.kernels,
            dtype=config.torch_dtype,
            device=platform.torch_device(),
            skip_tokenizer_init=target.tokenizer is None,
            byte_order=platform.byte_order,
        )
    except (OSError, ValueError, KeyError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"speculative_config: the draft model {model!r} could not be loaded: {reason}") from exc
    sizes = draft.hf_config.vocab_size, target.hf_config.vocab_size
    same = sizes[0] == sizes[1]
    if same and draft.tokenizer is not None and target.tokenizer is not None:
        same = draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    if not same:
        raise ValueError(
            f"speculative_config: the draft model {model!r} has another vocabulary than the target "
            f"{target.name!r} ({sizes[0]} vs {sizes[1]} tokens{', same size' if sizes[0] == sizes[1] else ''}): "
            "a draft must share the target's tokenizer"
        )
    if draft.max_model_len < config.max_model_len:
        raise ValueError(
            f"speculative_config: the draft model {model!r} takes {draft.max_model_len} tokens, "
            f"less than max_model_len={config.max_model_len}"
        )
    if draft.kv_window is not None or target.kv_window is not None:
        raise ValueError("speculative_config: draft_model needs models without sliding-window-only attention")
    return ModelRunner(platform, draft, dataclasses.replace(config, enable_lora=False), runner=platform.make_runner())


def _open(matcher: Matcher | None) -> bool:
    return matcher is not None and not matcher.is_terminated()
