"""Pipeline parallelism's split of a model: which decoder layers each stage runs.

A model of ``num_layers`` layers over ``size`` stages: every stage gets ``num_layers // size``
layers, and the ``num_layers % size`` left over go one each to the stages before the last,
last-but-one first (vLLM's rule: the last stage also runs the final norm and the LM head).
``CORE_PP_LAYER_PARTITION`` (or vLLM's ``VLLM_PP_LAYER_PARTITION``), the layers of each stage
comma-separated (``"16,14"``), sets the split instead. The first stage embeds the tokens; each
stage hands its hidden states and residual to the next; the last normalizes and computes the
logits.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_LAYER_INDEX = re.compile(r"model\.layers\.(\d+)\.")
#: the variables that set each stage's number of layers (the first one set is read)
PARTITION_ENV = ("CORE_PP_LAYER_PARTITION", "VLLM_PP_LAYER_PARTITION")


def split_layers(num_layers: int, size: int, partition: str | None = None) -> list[tuple[int, int]]:
    """Each stage's layers ``[start, stop)`` (see the module docstring).

    :param partition: each stage's number of layers, comma-separated (the environment's
        :data:`PARTITION_ENV` by default); empty: the even split.
    :raises ValueError: when there are fewer layers than stages, or a partition that does not
        give each of ``size`` stages at least one of the ``num_layers`` layers (naming the variable).
    """
    if size < 1 or num_layers < size:
        raise ValueError(
            f"pipeline_parallel_size={size} needs at least one layer per stage; the model has {num_layers} layers"
        )
    if partition is None:
        partition = next((os.environ[name] for name in PARTITION_ENV if os.environ.get(name)), "")
    if partition:
        try:
            counts = [int(part) for part in partition.split(",")]
        except ValueError:
            counts = []
        if len(counts) != size or sum(counts) != num_layers or min(counts) < 1:
            raise ValueError(
                f"{'/'.join(PARTITION_ENV)}={partition!r}: expected {size} positive layer counts summing to "
                f"{num_layers}, comma-separated"
            )
    else:
        counts = [num_layers // size] * size
        for i in range(num_layers % size):
            counts[-2 - i] += 1
    bounds, start = [], 0
    for count in counts:
        bounds.append((start, start + count))
        start += count
    return bounds


@dataclass(frozen=True)
class PipelineStage:
    """Stage ``rank`` of ``size``: layers ``[start, stop)`` of the model's ``num_layers``."""

    rank: int
    size: int
    start: int
    stop: int
    num_layers: int

    @classmethod
    def build(cls, num_layers: int, rank: int, size: int) -> PipelineStage:
        """Stage ``rank`` of a model of ``num_layers`` layers split over ``size`` stages."""
        if not 0 <= rank < size:
            raise ValueError(f"pipeline rank {rank} is outside [0, {size})")
        start, stop = split_layers(num_layers, size)[rank]
        return cls(rank, size, start, stop, num_layers)

    @classmethod
    def whole(cls, num_layers: int) -> PipelineStage:
        """The one stage of a model that is not split into stages."""
        return cls(0, 1, 0, num_layers, num_layers)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.size - 1

    def holds(self, name: str, tied_embeddings: bool) -> bool:
        """Whether this stage loads the weight with Hugging Face name ``name``.

        :param tied_embeddings: the LM head is the embedding (the last stage then holds it too).
        """
        if match := _LAYER_INDEX.match(name):
            return self.start <= int(match[1]) < self.stop
        if name == "model.embed_tokens.weight":
            return self.is_first or (self.is_last and tied_embeddings)
        if name in ("model.norm.weight", "lm_head.weight"):
            return self.is_last
        return True  # rope tables and the like
