"""What a pooling request asks for and what it gets back (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: what a pooling request computes: a normalized-or-not vector, the classification head's probabilities,
#: or a cross-encoder's score of a text pair
POOLING_TASKS = ("embed", "classify", "score")


@dataclass(frozen=True)
class PoolingParams:
    """One pooling request's options.

    :ivar task: ``"embed"`` (the pooled vector), ``"classify"`` (the head's softmax; a sigmoid for one
        label) or ``"score"`` (a cross-encoder's one-label head on a pair encoded as one input,
        ``[CLS] a [SEP] b [SEP]``: its sigmoid; tokens after the first separator are the second segment).
    :ivar normalize: L2-normalize the vector; None: as the model's pooler config says.
    :ivar dimensions: keep the first ``dimensions`` values, then normalize (Matryoshka models only).
    :ivar truncate_prompt_tokens: keep at most this many tokens of the input (-1: the model's
        limit) instead of refusing a longer one.
    """

    task: str = "embed"
    normalize: bool | None = None
    dimensions: int | None = None
    truncate_prompt_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be a positive integer, got {self.dimensions}")
        if self.truncate_prompt_tokens is not None and self.truncate_prompt_tokens < -1:
            raise ValueError(
                f"truncate_prompt_tokens must be -1 or a non-negative integer, got {self.truncate_prompt_tokens}"
            )


@dataclass
class PoolingOutput:
    """The pooled result of one input: ``data`` is a float32 vector on the host."""

    data: torch.Tensor

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()

    @property
    def probs(self) -> list[float]:
        return self.data.tolist()


@dataclass
class PoolingRequestOutput:
    """One finished pooling request: its prompt's token ids and its result (empty when it was aborted)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: PoolingOutput
    finished: bool = True
    is_aborted: bool = False


@dataclass
class ScoringOutput:
    score: float


@dataclass
class ScoringRequestOutput:
    """A pair's similarity (``LLM.score``): cosine of two embeddings, or a cross-encoder's score."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ScoringOutput
    finished: bool = True
