"""Batched sampling on the logits' device.

Logits processors run in vLLM's order: logit bias, min_tokens masking, repetition /
presence / frequency penalties, then (random rows only) temperature, top-k, top-p,
min-p and the draw. Greedy rows take the argmax of the penalised logits. Random rows
draw by an exponential race, ``argmax(probs / E)`` with ``E ~ Exp(1)``: a seeded row
takes its noise from its own generator, so its tokens do not depend on the batch.
Logprobs are those of the raw model distribution, as in vLLM.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.outputs import Logprob
from core.sampling_params import SamplingParams


@dataclass
class SamplingState:
    """What the sampler needs to know about one row of the batch.

    ``generator`` is the request's own generator (see ``make_generator``) when it has
    a seed, else None (the device's default generator is used). ``eos_token_ids`` are
    masked, with ``params.stop_token_ids``, until ``params.min_tokens`` are generated.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    eos_token_ids: Sequence[int] = ()


@dataclass
class TokenLogprobs:
    """Logprob and 1-based rank of one chosen token, plus the top-k alternatives."""

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int]
    top_logprobs: list[float]

    def to_dict(self, decode: Callable[[int], str] | None = None) -> dict[int, Logprob]:
        """vLLM's per-position dict: the chosen token first, then the top-k by rank."""
        text = decode if decode is not None else (lambda _tid: None)
        out = {self.token_id: Logprob(self.logprob, self.rank, text(self.token_id))}
        for rank, (tid, lp) in enumerate(zip(self.top_token_ids, self.top_logprobs, strict=True), start=1):
            if tid not in out:
                out[tid] = Logprob(lp, rank, text(tid))
        return out


@dataclass
class SamplerOutput:
    """One sampled token per row; ``logprobs[i]`` is None unless row i asked for logprobs."""

    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator for one seeded request, on the device the logits live on."""
    return torch.Generator(device=device).manual_seed(seed)


class Sampler:
    """Turns a batch of logits into one token per row, following each row's params."""

    def __call__(self, logits: torch.Tensor, states: Sequence[SamplingState]) -> SamplerOutput:
        """Sample from float32 ``logits`` [N, V] for the N ``states`` (same order)."""
        if logits.dim() != 2 or logits.shape[0] != len(states):
            raise ValueError(
                f"logits must be [N, V] with N = len(states) = {len(states)}, got shape {tuple(logits.shape)}"
            )
        raw = logits.float()
        processed = raw.clone()
        apply_logit_bias(processed, states)
        apply_min_tokens(processed, states)
        if any(s.params.has_penalties for s in states):
            apply_penalties_from_states(processed, states)

        sampled = processed.argmax(dim=-1)
        random_rows = [i for i, s in enumerate(states) if not s.params.is_greedy]
        if random_rows:
            sub_states = [states[i] for i in random_rows]
            rows = torch.tensor(random_rows, device=logits.device)
            sampled[rows] = _sample_random(processed[rows], sub_states)

        logprob_rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        logprobs: list[TokenLogprobs | None] = [None] * len(states)
        if logprob_rows:
            rows = torch.tensor(logprob_rows, device=logits.device)
            entries = gather_logprobs(
                torch.log_softmax(raw[rows], dim=-1),
                sampled[rows],
                [states[i].params.logprobs for i in logprob_rows],
            )
            for i, entry in zip(logprob_rows, entries, strict=True):
                logprobs[i] = entry
        return SamplerOutput(sampled_token_ids=sampled.tolist(), logprobs=logprobs)


def _sample_random(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p, then the exponential race, for random rows."""
    device = logits.device
    params = [s.params for s in states]
    temperature = torch.tensor([p.temperature for p in params], device=device)
    logits = logits / temperature.unsqueeze(1)
    vocab_size = logits.shape[1]
    top_k = top_p = None
    if any(p.is_top_k_enabled for p in params):
        top_k = torch.tensor([p.top_k if p.is_top_k_enabled else vocab_size for p in params], device=device)
    if any(p.top_p < 1 for p in params):
        top_p = torch.tensor([p.top_p for p in params], device=device)
    if top_k is not None or top_p is not None:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, torch.tensor([p.min_p for p in params], device=device))
    probs = torch.softmax(logits, dim=-1)
    return exponential_race(probs, [s.generator for s in states])


def exponential_race(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row of ``probs`` as ``argmax(probs / E)``, ``E ~ Exp(1)``.

    Row i's noise comes from ``generators[i]`` when given (reproducible whatever else
    is in the batch), else from the device's default generator.
    """
    noise = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.exponential_()
    else:
        for i, gen in enumerate(generators):
            if gen is not None:
                noise[i].exponential_(generator=gen)
        if unseeded:
            rows = torch.tensor(unseeded, device=probs.device)
            noise[rows] = torch.empty_like(probs[rows]).exponential_()
    # an Exp(1) draw can be exactly 0; keep the division finite and NaN-free
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return (probs / noise).argmax(dim=-1)


def apply_logit_bias(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    """Add each row's ``params.logit_bias`` to its logits, in place."""
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    vocab_size = logits.shape[1]
    for i, state in enumerate(states):
        for tid, bias in (state.params.logit_bias or {}).items():
            if tid >= vocab_size:
                raise ValueError(f"logit_bias token id {tid} is out of range for vocab size {vocab_size}")
            rows.append(i)
            cols.append(tid)
            values.append(bias)
    if rows:
        index = (_long(rows, logits.device), _long(cols, logits.device))
        bias_tensor = torch.tensor(values, dtype=logits.dtype, device=logits.device)
        logits.index_put_(index, bias_tensor, accumulate=True)


def apply_min_tokens(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    """Forbid EOS and stop token ids, in place, for rows short of ``min_tokens``."""
    rows: list[int] = []
    cols: list[int] = []
    vocab_size = logits.shape[1]
    for i, state in enumerate(states):
        if len(state.output_token_ids) < state.params.min_tokens:
            ids = [t for t in state.params.stop_ids_for(tuple(state.eos_token_ids)) if t < vocab_size]
            rows.extend([i] * len(ids))
            cols.extend(ids)
    if rows:
        logits[_long(rows, logits.device), _long(cols, logits.device)] = float("-inf")


def apply_penalties_from_states(logits: torch.Tensor, states: Sequence[SamplingState]) -> None:
    """Build token counts from the states and apply the penalties in place."""
    device, vocab_size = logits.device, logits.shape[1]
    output_counts = token_counts([s.output_token_ids for s in states], vocab_size, device)
    if any(s.params.repetition_penalty != 1 for s in states):
        prompt_mask = token_counts([s.prompt_token_ids for s in states], vocab_size, device) > 0
    else:
        prompt_mask = torch.zeros_like(output_counts, dtype=torch.bool)

    def column(name: str) -> torch.Tensor:
        values = [getattr(s.params, name) for s in states]
        return torch.tensor(values, dtype=logits.dtype, device=device).unsqueeze(1)

    apply_penalties(
        logits,
        prompt_mask,
        output_counts,
        presence=column("presence_penalty"),
        frequency=column("frequency_penalty"),
        repetition=column("repetition_penalty"),
    )


def token_counts(token_lists: Sequence[Sequence[int]], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[N, vocab_size] float counts of each token id in each row's list (ids >= V ignored)."""
    counts = torch.zeros(len(token_lists), vocab_size + 1, device=device)
    lengths = [len(t) for t in token_lists]
    if sum(lengths):
        cols = _long(list(itertools.chain.from_iterable(token_lists)), device)
        cols.clamp_(max=vocab_size)
        rows = torch.repeat_interleave(torch.arange(len(token_lists), device=device), _long(lengths, device))
        counts.index_put_((rows, cols), torch.ones_like(cols, dtype=counts.dtype), accumulate=True)
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    prompt_mask: torch.Tensor,
    output_counts: torch.Tensor,
    presence: torch.Tensor,
    frequency: torch.Tensor,
    repetition: torch.Tensor,
) -> None:
    """Apply vLLM's penalties in place; the penalty tensors are [N, 1].

    Repetition (over prompt and output tokens) divides positive logits and multiplies
    negative ones; frequency subtracts ``frequency * count`` and presence subtracts
    ``presence`` once for each token already in the output.
    """
    seen = prompt_mask | (output_counts > 0)
    rep = torch.where(seen, repetition, torch.ones_like(repetition))
    logits.copy_(torch.where(logits > 0, logits / rep, logits * rep))
    logits -= frequency * output_counts
    logits -= presence * (output_counts > 0).to(logits.dtype)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask (to -inf) tokens outside each row's top-k, then outside its top-p nucleus.

    ``top_k`` [N] int (V = off) keeps every token >= the k-th largest logit (ties kept);
    ``top_p`` [N] float (1 = off) keeps the smallest set of most likely tokens whose
    probability reaches p, and always the most likely token.
    """
    sorted_logits, order = logits.sort(dim=-1)  # ascending
    vocab_size = logits.shape[1]
    if top_k is not None:
        kth_index = (vocab_size - top_k.clamp(1, vocab_size)).unsqueeze(1)
        kth_value = sorted_logits.gather(1, kth_index)
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, float("-inf"))
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= (1 - top_p).unsqueeze(1)
        outside[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(outside, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` [N] times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: Sequence[int]) -> list[TokenLogprobs]:
    """Logprob, rank and the top ``num_top[i]`` of ``token_ids[i]`` in row i of ``logprobs``."""
    token_ids = token_ids.to(device=logprobs.device, dtype=torch.long)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    max_top = max(num_top, default=0)
    if max_top > 0:
        top_values, top_ids = logprobs.topk(max_top, dim=-1)
        top_values_list, top_ids_list = top_values.tolist(), top_ids.tolist()
    else:
        top_values_list = top_ids_list = [[] for _ in num_top]
    return [
        TokenLogprobs(tid, lp, rank, ids[:k], values[:k])
        for tid, lp, rank, ids, values, k in zip(
            token_ids.tolist(),
            chosen.squeeze(1).tolist(),
            ranks.tolist(),
            top_ids_list,
            top_values_list,
            num_top,
            strict=True,
        )
    ]


def compute_prompt_logprobs(
    logits: torch.Tensor, next_token_ids: Sequence[int] | torch.Tensor, num_top: int
) -> list[TokenLogprobs]:
    """Prompt logprobs: row j of ``logits`` predicts ``next_token_ids[j]``.

    For a prompt p[0..P-1], pass the logits at positions 0..P-2 and p[1..P-1]; the
    first prompt token has no logprob (vLLM reports None for it).
    """
    if not isinstance(next_token_ids, torch.Tensor):
        next_token_ids = _long(list(next_token_ids), logits.device)
    if logits.dim() != 2 or logits.shape[0] != next_token_ids.shape[0]:
        raise ValueError(
            f"prompt logits must be [P, V] with P = {next_token_ids.shape[0]} next tokens, "
            f"got shape {tuple(logits.shape)}"
        )
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return gather_logprobs(logprobs, next_token_ids, [num_top] * logits.shape[0])


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
