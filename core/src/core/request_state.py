"""A request in flight: how it is built, what it has produced, and when it is done.

:func:`build_request` checks a new request and builds its :class:`RequestState`: the
``n`` sequences, their incremental detokenizers, stop checkers and generators.
After each step :meth:`RequestState.record_token` accounts for a sampled token and
decides whether the sequence is finished (the one place that decides it, with the
scheduler's cap on length); :meth:`RequestState.to_output` builds the request's
:class:`~core.outputs.RequestOutput`.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from core.detokenizer import IncrementalDetokenizer, StopChecker
from core.lora import LoRARequest
from core.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestMetrics, RequestOutput
from core.sampler import logprob_dict, make_generator, prompt_logprobs_for
from core.sampling_params import SamplingParams
from core.sequence import Sequence, SequenceStatus, check_length


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
    matcher: Any = None  # its grammar's matcher, for a request with structured outputs


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
        *,
        capped: bool,
    ) -> SequenceStatus | None:
        """Account for a token just appended to ``completion.seq``; return a finish status, if any.

        The one place a sequence's end is decided, in vLLM's order: a stop token or stop
        string, then length (``max_tokens``, or ``capped``: the scheduler's max_model_len or
        whole-cache limit).
        """
        params, seq = self.params, completion.seq
        if logprob is not None:  # only rows that asked for logprobs carry them
            completion.cumulative_logprob += logprob
            if completion.logprobs is None:
                completion.logprobs = []
            completion.logprobs.append(logprob_dict(token_id, logprob, rank, top or [], self.decode_token))
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
        if capped or seq.num_output_tokens >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH
        return None

    def record_prompt_logprobs(self, completion: Completion, first_pos: int, logits: torch.Tensor) -> None:
        """Prompt logprobs of positions ``first_pos + 1 ...`` from the logits of one prompt chunk."""
        if completion is not self.completions[0] or self.prompt_logprobs is None:
            return  # siblings share the prompt: record it once
        if len(self.prompt_logprobs) != first_pos + 1:
            return  # recomputed after preemption: already recorded
        targets = self.prompt_token_ids[first_pos + 1 : first_pos + 1 + logits.shape[0]]
        self.prompt_logprobs.extend(
            prompt_logprobs_for(logits, targets, self.params.prompt_logprobs, decode=self.decode_token)
        )

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


def build_request(
    request_id: str,
    prompt: str | None,
    prompt_token_ids: list[int],
    params: SamplingParams,
    *,
    seq_ids: Iterator[int],
    tokenizer: Any,
    vocab_size: int,
    eos_token_ids: list[int],
    max_model_len: int,
    device: torch.device,
    arrival_time: float,
    priority: int = 0,
    lora: LoRARequest | None = None,
) -> RequestState:
    """Check a new request against the model and build its state (``params.n`` sequences).

    :raises ValueError: an empty prompt, token ids that are not integers or are outside the
        vocabulary, or a request longer than ``max_model_len`` (:func:`core.sequence.check_length`).
    """
    try:  # plain ints from any integers (numpy's, 0-d tensors')
        prompt_token_ids = [operator.index(t) for t in prompt_token_ids]
    except TypeError:
        bad = next(t for t in prompt_token_ids if not hasattr(type(t), "__index__"))
        raise ValueError(f"prompt token ids must be integers, got {type(bad).__name__} {bad!r}") from None
    if any(not 0 <= t < vocab_size for t in prompt_token_ids):
        raise ValueError(f"prompt token ids must be in [0, {vocab_size}), the vocabulary of the model")
    params = params.clone(max_tokens=check_length(len(prompt_token_ids), params.max_tokens, max_model_len))
    completions = []
    for index in range(params.n):
        seq = Sequence(
            next(seq_ids),
            request_id,
            prompt_token_ids,
            params,
            arrival_time,
            priority,
            skip_prefix_cache=params.prompt_logprobs is not None,  # every prompt position must be computed
            lora=lora,
        )
        detokenizer = None
        if tokenizer is not None:
            detokenizer = IncrementalDetokenizer(
                tokenizer,
                prompt_token_ids,
                skip_special_tokens=params.skip_special_tokens,
                spaces_between_special_tokens=params.spaces_between_special_tokens,
            )
        stop_checker = (
            StopChecker(params.stop, params.include_stop_str_in_output, params.min_tokens) if params.stop else None
        )
        generator = None if params.seed is None else make_generator(params.seed + index, device)
        completions.append(Completion(seq, detokenizer, stop_checker, generator))
    return RequestState(
        request_id=request_id,
        prompt=prompt,
        prompt_token_ids=prompt_token_ids,
        params=params,
        completions=completions,
        stop_ids=frozenset(params.stop_ids_for(eos_token_ids)),
        tokenizer=tokenizer,
        metrics=RequestMetrics(arrival_time=arrival_time),
        prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
    )
