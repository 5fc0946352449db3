"""Sparse mixture-of-experts MLP: routing here, the experts' products in one platform kernel.

Each token's router logits pick its ``top_k`` experts (softmax, the best ``k``, optionally
renormalized to sum to 1, as transformers' Qwen3-MoE and Mixtral do); the whole batch's
expert products are one ``kernels.fused_moe`` call. Under tensor parallelism every rank
holds a slice of each expert's intermediate dimension and the partial sums are added.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from plugins.kernels import GGUFWeight, Kernels
from plugins.moe import ExpertWeights
from torch import nn

from core.models.layers import Linear, concat_rows
from core.partition.tensor_parallel import TensorParallel

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# "3.gate_proj" (one expert's, a Hugging Face folder) or "gate_proj" (every expert stacked, GGUF)
_PART = re.compile(r"(?:(\d+)\.)?(gate_proj|up_proj|down_proj)")


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights float32 [T, top_k], expert ids int64 [T, top_k])``: the ``top_k`` largest softmax
    probabilities of each row of ``router_logits [T, E]``, divided by their sum when ``renormalize``."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def expert_size(config: Any, size: int, world_size: int) -> int:
    """This rank's part of each expert's intermediate ``size`` (experts are split along it; the
    shard plan has checked that it divides)."""
    if config.hidden_act != "silu":
        raise ValueError(f"unsupported expert activation {config.hidden_act!r}; supported: silu")
    return size // world_size


def _stack(parts: list[Any]) -> Any:
    """Experts' matrices ``[rows, cols]`` (dense or GGUF) stacked in order: ``[E, rows, cols]``,
    or one GGUF weight of ``E * rows`` rows (:func:`~core.models.layers.concat_rows`)."""
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.stack(parts)
    if all(isinstance(p, GGUFWeight) for p in parts):
        return concat_rows(parts)
    raise ValueError(f"cannot stack expert weights of different kinds: {sorted({type(p).__name__ for p in parts})}")


def _join_gate_up(gate: Any, up: Any, num_experts: int) -> Any:
    """Each expert's gate rows then its up rows, from the two stacks."""
    if isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor):
        return torch.cat([gate, up], dim=1)
    if isinstance(gate, GGUFWeight) and isinstance(up, GGUFWeight) and (gate.qtype, gate.cols) == (up.qtype, up.cols):
        data = torch.cat([gate.data.view(num_experts, -1, gate.data.shape[-1]),
                          up.data.view(num_experts, -1, up.data.shape[-1])], dim=1)  # fmt: skip
        return GGUFWeight(gate.qtype, data.reshape(-1, data.shape[-1]), gate.rows + up.rows, gate.cols)
    raise ValueError("an expert's gate and up projections must be stored alike (dense, or one GGUF type)")


class SparseMoE(nn.Module):
    """A MoE MLP: the router (``gate``, Hugging Face's name) and ``num_experts`` gated MLPs.

    Its experts arrive part by part (:meth:`add_part`) and are handed to the kernels once
    all are in (:meth:`load_experts`).
    """

    def __init__(
        self,
        kernels: Kernels,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        renormalize: bool,
        tp: TensorParallel | None = None,
    ) -> None:
        """``intermediate_size``: each expert's, this rank's part of it."""
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be between 1 and the {num_experts} experts")
        self.kernels = kernels
        self.hidden_size = hidden_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.intermediate_size = intermediate_size
        self.renormalize = renormalize
        self.gate = Linear(kernels, hidden_size, num_experts, has_bias=False)
        self.experts: Any = None
        self.tp = tp
        self._parts: dict[str, dict[int, Any]] = {name: {} for name in _PROJECTIONS}

    def add_part(self, name: str, weight: Any) -> None:
        """Take ``"<expert>.<gate_proj|up_proj|down_proj>"`` (one expert's matrix) or
        ``"<gate_proj|up_proj|down_proj>"`` (every expert's, stacked: ``[E, rows, cols]`` or a
        GGUF weight of ``E * rows`` rows)."""
        match = _PART.fullmatch(name)
        if match is None:
            raise ValueError(f"unexpected expert weight {name!r}")
        index = -1 if match[1] is None else int(match[1])
        if index >= self.num_experts:
            raise ValueError(f"expert weight {name!r} is for expert {index}; the layer has {self.num_experts}")
        self._parts[match[2]][index] = weight

    def load_experts(self, quantization: str | None) -> None:
        """Stack the experts' parts and hand them to ``kernels.prepare_experts``.

        :raises ValueError: when a part is missing or has the wrong shape.
        """
        stacks = {}
        for name, parts in self._parts.items():
            if -1 in parts and len(parts) == 1:
                stacks[name] = parts[-1]
            elif sorted(parts) == list(range(self.num_experts)):
                stacks[name] = _stack([parts[i] for i in range(self.num_experts)])
            else:
                raise ValueError(f"expert {name} weights: got experts {sorted(parts)}, need 0..{self.num_experts - 1}")
        inter, hidden, num = self.intermediate_size, self.hidden_size, self.num_experts
        expected = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter)}
        for name, stack in stacks.items():
            rows, cols = expected[name]
            if isinstance(stack, torch.Tensor):
                shape, ok = list(stack.shape), tuple(stack.shape) == (num, rows, cols)
            else:
                shape, ok = [stack.rows, stack.cols], (stack.rows, stack.cols) == (num * rows, cols)
            if not ok:
                raise ValueError(f"expert {name} weights have shape {shape}, expected {[num, rows, cols]}")
        gate_up = _join_gate_up(stacks["gate_proj"], stacks["up_proj"], self.num_experts)
        experts = ExpertWeights(gate_up, stacks["down_proj"], self.num_experts)
        self.experts = self.kernels.prepare_experts(experts, quantization)
        self._parts = {name: {} for name in _PROJECTIONS}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.renormalize)
        out = self.kernels.fused_moe(x, self.experts, weights, ids)
        return self.tp.all_reduce(out) if self.tp is not None else out
