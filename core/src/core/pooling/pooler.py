"""From a batch's hidden states to one vector per sequence: pool, cut, normalize."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from core.pooling.config import PoolerConfig
from core.pooling.params import PoolingParams


def pool(hidden: torch.Tensor, seq_lens: list[int], pooling_type: str) -> torch.Tensor:
    """float32 ``[N, H]``: each sequence's mean, first ([CLS]) or last row of ``hidden [T, H]``
    (sequence ``i`` owns the ``seq_lens[i]`` rows after those of the sequences before it)."""
    lens = torch.tensor(seq_lens, device=hidden.device)
    ends = lens.cumsum(0)
    if pooling_type == "cls":
        return hidden[ends - lens].float()
    if pooling_type == "last":
        return hidden[ends - 1].float()
    owner = torch.repeat_interleave(torch.arange(len(seq_lens), device=hidden.device), lens)
    sums = torch.zeros(len(seq_lens), hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, owner, hidden.float())
    return sums / lens.unsqueeze(1)


def finish(vector: torch.Tensor, params: PoolingParams, config: PoolerConfig) -> torch.Tensor:
    """One pooled ``[H]`` vector as the request asked for it: cut to ``dimensions``, then normalized
    when the request (or, by default, the model) says so."""
    if params.dimensions is not None:
        vector = vector[: params.dimensions]
    normalize = config.normalize if params.normalize is None else params.normalize
    return F.normalize(vector, dim=-1) if normalize else vector


def check_dimensions(params: PoolingParams, config: PoolerConfig, hidden_size: int) -> None:
    """ValueError when ``params.dimensions`` is not a size the model supports."""
    if params.dimensions is None:
        return
    dims = config.matryoshka_dimensions
    if dims is None:
        raise ValueError(f"this model does not support matryoshka representation: dimensions={params.dimensions}")
    if params.dimensions not in dims or params.dimensions > hidden_size:
        raise ValueError(f"dimensions={params.dimensions} is not one of this model's matryoshka sizes")
