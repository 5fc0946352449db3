"""Each adapted linear's adapters stacked in slots, and the delta it adds to a mixed batch.

:func:`attach` gives every q/k/v, o, gate/up and down projection of a Llama-family model a
:class:`StackedLoRA` (as the linear's ``lora``): ``max_loras`` slots of ``A`` and ``B``
matrices at the largest rank. The linear adds its delta when the step's
:class:`LoRAContext` holds a mapping, through ``Kernels.lora_shrink`` and ``Kernels.lora_expand``;
without one (a step with no adapter rows) it adds nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from plugins.lora import LoRAMapping, LoRAWeights

#: peft module name -> (the model's linear holding it, which part of that linear's outputs)
MODULE_PARTS = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}


@dataclass
class LoRAContext:
    """The current step's rows -> slots, shared by one model's adapted linears (None: no adapter rows)."""

    mapping: LoRAMapping | None = None


class StackedLoRA:
    """The ``A``/``B`` slots of one linear whose outputs are ``parts`` (one size each, in order).

    ``a`` is ``[slots, len(parts) * R, in]`` (each part's ``A`` in its own ``R`` rows: one shrink
    for a fused projection), ``b[i]`` is ``[slots, parts[i], R]``.
    """

    def __init__(self, kernels: Any, context: LoRAContext, in_features: int, parts: list[int], num_slots: int,
                 max_rank: int, dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        self.kernels = kernels
        self.context = context
        self.in_features = in_features
        self.parts = parts
        self.rank = max_rank
        self.a = torch.zeros(num_slots, len(parts) * max_rank, in_features, dtype=dtype, device=device)
        self.b = [torch.zeros(num_slots, n, max_rank, dtype=dtype, device=device) for n in parts]
        self.offsets = [sum(parts[:i]) for i in range(len(parts))]

    def set_slot(self, slot: int, weights: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Hold in ``slot`` the ``(A [r, in], B [out_i, r])`` of each part in ``weights`` (others zero)."""
        self.a[slot].zero_()
        for b in self.b:
            b[slot].zero_()
        for part, (a, b) in weights.items():
            r = a.shape[0]
            self.a[slot, part * self.rank : part * self.rank + r].copy_(a)
            self.b[part][slot, :, :r].copy_(b)

    def describe(self) -> LoRAWeights:
        """The slots as the SDK describes them to native runners (the same tensors, not copies)."""
        return LoRAWeights(self.a, tuple(self.b), self.rank)

    def __call__(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (the base linear's output for ``x``) plus the step's adapter deltas, in place."""
        mapping = self.context.mapping
        if mapping is None:
            return out
        h = self.kernels.lora_shrink(x, self.a, mapping)
        for i, (b, offset) in enumerate(zip(self.b, self.offsets, strict=True)):
            self.kernels.lora_expand(out, h[:, i * self.rank : (i + 1) * self.rank], b, mapping, offset)
        return out


def attach(model: Any, num_slots: int, max_rank: int) -> tuple[LoRAContext, dict[tuple[int, str], StackedLoRA]]:
    """Give each adaptable linear of ``model`` (its ``layers[i]``) a :class:`StackedLoRA`.

    Returns the model's context and the stacks by ``(layer, linear path)``. A layer without
    a linear (a mixture-of-experts MLP has no ``gate_up_proj``) gets none there.
    """
    context = LoRAContext()
    stacks: dict[tuple[int, str], StackedLoRA] = {}
    for index, layer in enumerate(model.layers):
        attn = layer.self_attn
        part_sizes = {"self_attn.qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size]}
        for path in dict.fromkeys(p for p, _ in MODULE_PARTS.values()):
            try:
                linear = layer.get_submodule(path)
            except AttributeError:
                continue
            parts = part_sizes.get(path) or (
                [linear.out_features // 2] * 2 if path.endswith("gate_up_proj") else [linear.out_features]
            )
            stack = StackedLoRA(model.kernels, context, linear.in_features, parts, num_slots, max_rank, model.dtype,
                                model.device)  # fmt: skip
            linear.lora = stack
            stacks[(index, path)] = stack
    return context, stacks
