"""Mixture-of-experts weights and the torch reference of their products, grouped by expert.

A MoE layer's experts are gated MLPs, ``down_e(silu(gate_e x) * up_e x)``, stacked as
:class:`ExpertWeights`. Core routes each token to its ``top_k`` experts (softmax over the
router's logits, the best ``k``, optionally renormalized) and hands the whole batch to
``Kernels.fused_moe`` at once; :func:`grouped_experts` is that kernel's default.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ExpertWeights:
    """The stacked experts of one MoE layer, as the model loaded them.

    :ivar gate_up: ``[E, 2I, H]``: each expert's gate rows, then its up rows; or a
        ``plugins.kernels.GGUFWeight`` of ``E * 2I`` rows of ``H`` in that order (GGUF rows are
        quantized one by one, so an expert's rows are a slice).
    :ivar down: ``[E, H, I]``, or a ``GGUFWeight`` of ``E * H`` rows of ``I``.
    """

    gate_up: Any
    down: Any
    num_experts: int

    @property
    def intermediate_size(self) -> int:
        """``I``: the inputs of each expert's down projection."""
        return self.down.shape[-1] if isinstance(self.down, torch.Tensor) else self.down.cols

    def stored(self, name: str, index: int) -> Any:
        """Expert ``index``'s ``"gate_up"`` or ``"down"`` matrix as stored: a tensor, or a ``GGUFWeight`` of its rows."""
        stacked = getattr(self, name)
        if isinstance(stacked, torch.Tensor):
            return stacked[index]
        rows = stacked.rows // self.num_experts
        part = stacked.data.reshape(stacked.rows, -1)[index * rows : (index + 1) * rows]
        return dataclasses.replace(stacked, data=part, rows=rows)

    def expert(self, name: str, index: int) -> torch.Tensor:
        """Expert ``index``'s ``"gate_up"`` or ``"down"`` matrix, dense (GGUF rows dequantized to float32)."""
        stored = self.stored(name, index)
        return stored if isinstance(stored, torch.Tensor) else stored.dequantize()


def grouped_experts(
    x: torch.Tensor, experts: ExpertWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_k topk_weights[t, k] * expert_{topk_ids[t, k]}(x[t])`` for every token ``t``, in float32
    math, returned in ``x``'s dtype.

    The (token, expert) pairs are sorted by expert, so each expert used runs one matmul over
    all of its tokens; each pair's output is weighted and summed into its token's row.
    """
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    tokens = order // top_k  # the token of each sorted pair
    counts = torch.bincount(flat_ids, minlength=experts.num_experts).tolist()
    rows = x[tokens].float()
    outputs = torch.empty(rows.shape[0], x.shape[-1], dtype=torch.float32, device=x.device)
    start = 0
    for index, count in enumerate(counts):
        if count:
            batch = rows[start : start + count]
            gate, up = F.linear(batch, experts.expert("gate_up", index).float()).chunk(2, dim=-1)
            outputs[start : start + count] = F.linear(F.silu(gate) * up, experts.expert("down", index).float())
            start += count
    outputs *= topk_weights.reshape(-1)[order].float().unsqueeze(-1)
    out = torch.zeros(num_tokens, x.shape[-1], dtype=torch.float32, device=x.device)
    return out.index_add_(0, tokens, outputs).to(x.dtype)
