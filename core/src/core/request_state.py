"""Per-request bookkeeping after sampling: stop checks, detokenization, logprobs, outputs.

One :class:`RequestState` holds the ``n`` sequences of a request, their incremental
detokenizers and what has been produced so far, and builds the request's
:class:`~core.outputs.RequestOutput`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from core.detokenizer import IncrementalDetokenizer, StopChecker
from core.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput
from core.sampling_params import SamplingParams
from core.sequence import Sequence, SequenceStatus


@dataclass
class Completion:
    """What one sequence has produced: text, logprobs and how it ended."""

    seq: Sequence
    detokenizer: IncrementalDetokenizer | None
    stop_checker: StopChecker | None
    generator: Any
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    stop_reason: str | int | None = None


@dataclass
class RequestState:
    """A request in flight: its sequences and everything its outputs are made of."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    completions: list[Completion]
    stop_ids: frozenset[int]
    tokenizer: Any
    metrics: RequestMetrics
    prompt_logprobs: PromptLogprobs | None = None
    num_cached_tokens: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(c.seq.is_finished for c in self.completions)

    def decode_token(self, token_id: int) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.convert_ids_to_tokens(token_id)

    def record_token(
        self,
        completion: Completion,
        token_id: int,
        logprob: float | None,
        rank: int | None,
        top: list[tuple[int, float]] | None,
    ) -> SequenceStatus | None:
        """Account for a token just appended to ``completion.seq``; return a finish status, if any."""
        params, seq = self.params, completion.seq
        if logprob is not None:  # only rows that asked for logprobs carry them
            completion.cumulative_logprob += logprob
            entry = {token_id: Logprob(logprob, rank, self.decode_token(token_id))}
            for rank_i, (tid, lp) in enumerate(top or [], start=1):
                entry.setdefault(tid, Logprob(lp, rank_i, self.decode_token(tid)))
            if completion.logprobs is None:
                completion.logprobs = []
            completion.logprobs.append(entry)
        now = time.time()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.last_token_time = now

        is_stop_token = token_id in self.stop_ids  # the sampler masks them until min_tokens
        if completion.detokenizer is not None and not (is_stop_token and not params.include_stop_str_in_output):
            delta = completion.detokenizer.add(token_id)
            if completion.stop_checker is not None:
                completion.text, matched = completion.stop_checker.check(completion.text, delta, seq.num_output_tokens)
                if matched is not None:
                    completion.stop_reason = matched
                    return SequenceStatus.FINISHED_STOPPED
            else:
                completion.text += delta
        if is_stop_token:
            completion.stop_reason = token_id if token_id in (params.stop_token_ids or []) else None
            return SequenceStatus.FINISHED_STOPPED
        if seq.num_output_tokens >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def to_output(self) -> RequestOutput:
        """The request's outputs so far (cumulative text and tokens)."""
        outputs = []
        for index, c in enumerate(self.completions):
            text = c.text
            if c.stop_checker is not None and not c.seq.is_finished:
                text = c.stop_checker.visible(c.text)  # hold back a possible stop-string prefix
            outputs.append(
                CompletionOutput(
                    index=index,
                    text=text,
                    token_ids=list(c.seq.output_token_ids),
                    cumulative_logprob=c.cumulative_logprob if self.params.logprobs is not None else None,
                    logprobs=c.logprobs,
                    finish_reason=c.seq.finish_reason,
                    stop_reason=c.stop_reason,
                )
            )
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            prompt_logprobs=self.prompt_logprobs,
            outputs=outputs,
            finished=self.finished,
            metrics=self.metrics,
            num_cached_tokens=self.num_cached_tokens,
        )
