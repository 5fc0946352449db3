"""The model's side of tensor parallelism: its rank's shard plan and the collectives it needs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from core.partition.sharding import ShardPlan


class TensorParallel:
    """A rank's :class:`ShardPlan` plus its communicator (None when the model is not split).

    With one rank every method is the plain single-process operation.
    """

    def __init__(self, plan: ShardPlan, comm: Any | None) -> None:
        if plan.is_sharded and comm is None:
            raise ValueError(f"a model split over {plan.world_size} ranks needs a communicator")
        self.plan = plan
        self.comm = comm

    @classmethod
    def build(cls, config: Any, head_size: int, comm: Any | None) -> TensorParallel:
        """The plan of ``comm``'s rank (rank 0 of 1 without a communicator)."""
        rank, world_size = (comm.rank, comm.world_size) if comm is not None else (0, 1)
        return cls(ShardPlan(config, head_size, rank, world_size), comm)

    @property
    def is_sharded(self) -> bool:
        return self.plan.is_sharded

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """Sum a row-parallel layer's partial outputs over the ranks."""
        return self.comm.all_reduce(partial) if self.is_sharded else partial

    def embed(self, input_ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        """Embedding lookup in a vocabulary-parallel table (each rank holds rows ``[vocab_start, vocab_stop)``)."""
        if not self.is_sharded:
            return F.embedding(input_ids, table)
        outside = (input_ids < self.plan.vocab_start) | (input_ids >= self.plan.vocab_stop)
        local = (input_ids - self.plan.vocab_start).masked_fill(outside, 0)
        hidden = F.embedding(local, table).masked_fill(outside.unsqueeze(-1), 0)
        return self.comm.all_reduce(hidden)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's vocabulary slice of the logits ``[N, part]``, joined into ``[N, vocab_size]``."""
        if not self.is_sharded:
            return local
        short = self.plan.vocab_per_rank - local.shape[-1]  # the last rank's slice may be shorter
        padded = F.pad(local, (0, short)) if short else local
        return self.comm.all_gather(padded, dim=-1)[..., : self.plan.vocab_size]
