"""Batched sampling on the logits' device.

Logits processors run in vLLM's order: logit bias, min_tokens masking, repetition /
presence / frequency penalties, then (random rows only) temperature, top-k, top-p,
min-p and the draw. Greedy rows take the argmax of the penalised logits. Random rows
draw by an exponential race, ``argmax(probs / E)`` with ``E ~ Exp(1)``: a seeded row
takes its noise from its own generator, so its tokens do not depend on the batch.
Logprobs are those of the raw model distribution, as in vLLM.

Speculative runs drawn by a draft model (:class:`DraftRun`) are verified here too, by the
rejection sampler of Leviathan et al.: each draft ``x`` drawn from ``q`` is accepted with
probability ``min(1, p(x) / q(x))`` under the row's final distribution ``p``, and the first
rejected row draws from ``max(p - q, 0)`` renormalised, so every kept token has ``p``'s
distribution and the logprobs reported are those of the kept tokens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from core.outputs import Logprob
from core.sampling_params import SamplingParams


@dataclass
class SamplingState:
    """What the sampler needs to know about one row of the batch.

    ``generator`` is the request's own generator (see ``make_generator``) when it has
    a seed, else None (the device's default generator is used). ``stop_token_ids``
    are every id that would end the request, EOS included unless ``ignore_eos``
    (``params.stop_ids_for(eos_token_ids)``): they are masked until
    ``params.min_tokens`` tokens have been generated.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    generator: torch.Generator | None = None
    stop_token_ids: Sequence[int] = ()


@dataclass
class SamplerOutput:
    """One sampled token per row, with logprobs for the rows whose params ask for them.

    ``logprobs[i]`` / ``ranks[i]`` are the sampled token's logprob under the raw model
    distribution and its 1-based rank; ``top_logprobs[i]`` the ``params.logprobs``
    most likely ``(token_id, logprob)``. All three are None for rows that did not ask.
    """

    token_ids: list[int]
    logprobs: list[float | None]
    ranks: list[int | None]
    top_logprobs: list[list[tuple[int, float]] | None]
    #: with ``keep_probs``: row -> the distribution its token was drawn from, for random rows
    probs: dict[int, torch.Tensor] = field(default_factory=dict)


@dataclass
class DraftRun:
    """Drafts of one sequence drawn from a draft model's distributions, to verify.

    Rows ``first_row .. first_row + len(token_ids)`` of the batch score them (row ``j``
    the draft ``token_ids[j]``, the last row the token after a fully accepted run); every
    row samples at random. ``probs[j]`` is the distribution ``token_ids[j]`` was drawn from.
    """

    first_row: int
    token_ids: list[int]
    probs: torch.Tensor  # [len(token_ids), V]


def make_generator(seed: int, device: torch.device | str) -> torch.Generator:
    """A generator for one seeded request, on the device the logits live on."""
    return torch.Generator(device=device).manual_seed(seed)


class Sampler:
    """Turns a batch of logits into one token per row, following each row's params.

    :param stage: moves a host tensor of per-row values to the logits' device (the platform
        runner's ``stage``: no synchronisation on a GPU); default ``Tensor.to(logits.device)``.
    """

    def __init__(self, stage: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.stage = stage

    def __call__(
        self,
        logits: torch.Tensor,
        states: Sequence[SamplingState],
        keep_probs: bool = False,
        draft_runs: Sequence[DraftRun] = (),
    ) -> SamplerOutput:
        """Sample from float32 ``logits`` [N, V] for the N ``states`` (same order).

        :param keep_probs: return each random row's final distribution (``probs``).
        :param draft_runs: speculative runs to verify by rejection sampling: each row of a
            run gets its accepted draft, the row of the first rejected draft a token of the
            residual distribution (and rows after it what they drew, unused).
        """
        if logits.dim() != 2 or logits.shape[0] != len(states):
            raise ValueError(
                f"logits must be [N, V] with N = len(states) = {len(states)}, got shape {tuple(logits.shape)}"
            )
        stage = self.stage or (lambda host: host.to(logits.device))
        raw = logits.float()
        processed = raw
        if any(_edits_logits(s) for s in states):  # a copy only then: [N, V] is MBs a step
            processed = raw.clone()
            apply_logit_bias(processed, states)
            apply_min_tokens(processed, states)
            if any(s.params.has_penalties for s in states):
                apply_penalties_from_states(processed, states)

        random_rows = [i for i, s in enumerate(states) if not s.params.is_greedy]
        probs = None
        if states and len(random_rows) == len(states):  # every row random: no argmax, no index to move
            sampled, probs = _sample_random(processed, states, stage)
        else:
            sampled = first_argmax(processed)
            if random_rows:
                rows = stage(torch.tensor(random_rows))
                sampled[rows], probs = _sample_random(processed[rows], [states[i] for i in random_rows], stage)
        row_probs = {} if probs is None else dict(zip(random_rows, probs, strict=True))
        for run in draft_runs:
            verify_run(sampled, row_probs, run, states[run.first_row].generator)

        num_rows = len(states)
        out = SamplerOutput(sampled.tolist(), [None] * num_rows, [None] * num_rows, [None] * num_rows)
        if keep_probs:
            out.probs = row_probs
        logprob_rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
        if logprob_rows:
            rows = stage(torch.tensor(logprob_rows))
            gathered = gather_logprobs(
                torch.log_softmax(raw[rows], dim=-1),
                sampled[rows],
                [states[i].params.logprobs for i in logprob_rows],
            )
            for i, (logprob, rank, top) in zip(logprob_rows, gathered, strict=True):
                out.logprobs[i], out.ranks[i], out.top_logprobs[i] = logprob, rank, top
        return out


def first_argmax(x: torch.Tensor, block: int = 128) -> torch.Tensor:
    """Index of each row's first maximum of ``x`` [N, V] (a NaN counts as the maximum).

    The same indices as ``x.max(dim=-1).indices``, found in two passes: the maximum of
    every ``block`` columns (``amax``, a plain vectorized reduction), then the first
    maximum inside each row's first winning block. ``max(dim)`` tracks an index per
    element; ``amax`` does not, so on a CPU the two passes beat ``max(dim)`` and ``argmax``.
    """
    rows, width = x.shape
    whole = width // block * block
    if whole == 0:
        return x.max(dim=-1).indices
    blocks = x[:, :whole].reshape(rows, -1, block)
    best = blocks.amax(dim=-1)  # [N, V / block]
    if whole < width:  # the tail is its own, last block
        best = torch.cat([best, x[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    winner = best.max(dim=-1).indices  # the first block holding the row's maximum
    starts = winner * block
    span = torch.arange(block, device=x.device)
    cols = (starts.unsqueeze(1) + span).clamp_(max=width - 1)  # the tail block repeats its last column
    return starts + x.gather(1, cols).max(dim=-1).indices


def _edits_logits(state: SamplingState) -> bool:
    """Whether the row's logits change before sampling (logit bias, min tokens, penalties)."""
    p = state.params
    return bool(p.logit_bias) or len(state.output_token_ids) < p.min_tokens or p.has_penalties


def verify_run(
    sampled: torch.Tensor, row_probs: dict[int, torch.Tensor], run: DraftRun, generator: torch.Generator | None
) -> None:
    """Rejection sampling of one draft run, in place on ``sampled`` (see the module's docstring).

    ``row_probs``: each random row's final distribution ``p``; the uniforms and the residual's
    draw come from the sequence's ``generator`` (the device's default one when None).
    """
    for j, draft in enumerate(run.token_ids):
        row = run.first_row + j
        if row not in row_probs:
            raise ValueError(f"draft run row {row} does not sample at random: greedy drafts are verified by argmax")
        p, q = row_probs[row], run.probs[j]
        u = torch.rand((), generator=generator, device=p.device)
        if bool(u * q[draft] < p[draft]):  # accepted with probability min(1, p / q)
            sampled[row] = draft
            continue
        residual = (p - q).clamp_(min=0)  # zero at the draft, as p(draft) < q(draft) here
        if not bool(residual.sum() > 0):  # p == q up to rounding: the residual is p without the draft
            residual = p.clone()
            residual[draft] = 0
        sampled[row] = exponential_race(residual.unsqueeze(0), [generator])[0]
        return


def _sample_random(
    logits: torch.Tensor, states: Sequence[SamplingState], stage: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Temperature, top-k, top-p, min-p, then the exponential race, for random rows
    (per-row values moved to the device by ``stage``); the tokens and the distributions."""
    params = [s.params for s in states]
    temperature = stage(torch.tensor([p.temperature for p in params]))
    logits = logits / temperature.unsqueeze(1)
    vocab_size = logits.shape[1]
    top_k = top_p = None
    if any(p.is_top_k_enabled for p in params):
        top_k = stage(torch.tensor([p.top_k if p.is_top_k_enabled else vocab_size for p in params]))
    if any(p.top_p < 1 for p in params):
        top_p = stage(torch.tensor([p.top_p for p in params]))
    if top_k is not None or top_p is not None:
        logits = apply_top_k_top_p(logits, top_k, top_p)
    if any(p.min_p > 0 for p in params):
        logits = apply_min_p(logits, stage(torch.tensor([p.min_p for p in params])))
    probs = torch.softmax(logits, dim=-1)
    return exponential_race(probs, [s.generator for s in states]), probs


def exponential_race(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """Draw one token per row of ``probs`` as ``argmax(probs / E)``, ``E ~ Exp(1)``.

    Row i's noise comes from ``generators[i]`` when given (reproducible whatever else
    is in the batch), else from the device's default generator.
    """
    # E = -log(U), U ~ U[0, 1): cheaper than exponential_() on CPUs, and E > 0
    noise = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if len(unseeded) == len(generators):
        noise.uniform_()
    else:
        for i, gen in enumerate(generators):
            if gen is not None:
                noise[i].uniform_(generator=gen)
        if unseeded:
            rows = torch.tensor(unseeded, device=probs.device)
            noise[rows] = torch.empty_like(probs[rows]).uniform_()
    noise.log_().neg_()
    return first_argmax(probs / noise)


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
    """Forbid each row's ``stop_token_ids`` (EOS included), in place, until ``min_tokens``."""
    rows: list[int] = []
    cols: list[int] = []
    vocab_size = logits.shape[1]
    for i, state in enumerate(states):
        if len(state.output_token_ids) < state.params.min_tokens:
            stop_ids = set(state.stop_token_ids).union(state.params.stop_token_ids or ())
            ids = [t for t in stop_ids if 0 <= t < vocab_size]
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

    ``top_k`` [N] int (>= V = off) keeps every token >= the k-th largest logit (ties
    kept); ``top_p`` [N] float (1 = off) keeps the smallest set of most likely tokens
    whose probability reaches p (renormalised after top-k), always the most likely one.
    Full-vocabulary sorts are avoided where top-k bounds the candidates.
    """
    vocab_size = logits.shape[1]
    max_candidates = vocab_size
    if top_k is not None:
        top_k = top_k.clamp(1, vocab_size)
        enabled = top_k < vocab_size
        max_k = int(torch.where(enabled, top_k, 1).max())
        kth = logits.topk(max_k, dim=-1).values.gather(1, (top_k.clamp(max=max_k) - 1).unsqueeze(1))
        kth = kth.masked_fill(~enabled.unsqueeze(1), float("-inf"))
        logits = logits.masked_fill(logits < kth, float("-inf"))
        max_candidates = max_k if bool(enabled.all()) else vocab_size
    if top_p is not None:
        rows = torch.nonzero(top_p < 1).flatten()
        if rows.numel():
            logits = logits.clone()
            logits[rows] = _top_p(logits[rows], top_p[rows], max_candidates)
    return logits


def _top_p(logits: torch.Tensor, top_p: torch.Tensor, max_candidates: int) -> torch.Tensor:
    """Top-p over rows with at most ``max_candidates`` finite logits each."""
    if max_candidates < logits.shape[1]:
        values, ids = logits.topk(max_candidates, dim=-1)
    else:
        values, ids = logits.sort(dim=-1, descending=True)
    probs = values.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
    values = values.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, ids, values)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` [N] times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: Sequence[int]
) -> list[tuple[float, int, list[tuple[int, float]]]]:
    """For row i: the logprob and 1-based rank of ``token_ids[i]``, and the top ``num_top[i]``."""
    token_ids = token_ids.to(device=logprobs.device, dtype=torch.long)
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    max_top = max(num_top, default=0)
    if max_top > 0:
        top_values, top_ids = logprobs.topk(max_top, dim=-1)
        tops = [
            list(zip(ids, values, strict=True))
            for ids, values in zip(top_ids.tolist(), top_values.tolist(), strict=True)
        ]
    else:
        tops = [[] for _ in num_top]
    return [
        (lp, rank, top[:k])
        for lp, rank, top, k in zip(chosen.squeeze(1).tolist(), ranks.tolist(), tops, num_top, strict=True)
    ]


def logprob_dict(
    token_id: int,
    logprob: float,
    rank: int,
    top: Sequence[tuple[int, float]],
    decode: Callable[[int], str | None] | None = None,
) -> dict[int, Logprob]:
    """vLLM's per-position dict: the chosen token first, then the top-k by rank.

    ``decode`` (e.g. ``tokenizer.convert_ids_to_tokens``) fills ``decoded_token``.
    """

    def text(tid: int) -> str | None:
        return decode(tid) if decode is not None else None

    out = {token_id: Logprob(logprob, rank, text(token_id))}
    for top_rank, (tid, lp) in enumerate(top, start=1):
        if tid not in out:
            out[tid] = Logprob(lp, top_rank, text(tid))
    return out


def prompt_logprobs_for(
    logits: torch.Tensor,
    next_token_ids: Sequence[int] | torch.Tensor,
    num_top: int,
    decode: Callable[[int], str | None] | None = None,
) -> list[dict[int, Logprob]]:
    """Prompt logprobs: row j of ``logits`` [P, V] predicts ``next_token_ids[j]``.

    For a prompt p[0..L-1], pass the logits at positions 0..L-2 and p[1..L-1] (or any
    chunk of them); the first prompt token has no logprob (vLLM reports None for it).
    Returns one ``logprob_dict`` per row: the actual token, then the top ``num_top``.
    """
    if not isinstance(next_token_ids, torch.Tensor):
        next_token_ids = _long(list(next_token_ids), logits.device)
    if logits.dim() != 2 or logits.shape[0] != next_token_ids.shape[0]:
        raise ValueError(
            f"prompt logits must be [P, V] with P = {next_token_ids.shape[0]} next tokens, "
            f"got shape {tuple(logits.shape)}"
        )
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    gathered = gather_logprobs(logprobs, next_token_ids, [num_top] * logits.shape[0])
    return [
        logprob_dict(tid, lp, rank, top, decode)
        for tid, (lp, rank, top) in zip(next_token_ids.tolist(), gathered, strict=True)
    ]


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)
