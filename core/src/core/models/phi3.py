"""Phi-3: the Llama decoder with q/k/v and gate/up stored fused (``qkv_proj``, ``gate_up_proj``,
the layout this engine runs anyway), every layer within ``config.sliding_window`` where the
config sets one, and LongRoPE scaling (:mod:`core.models.rope`)."""

from __future__ import annotations

from typing import Any

import torch
from plugins.kernels import Kernels

from core.models.mistral import MistralForCausalLM


class Phi3ForCausalLM(MistralForCausalLM):
    """Phi-3 causal LM (Phi-3 mini/small/medium, Phi-3.5 mini)."""

    def __init__(
        self, config: Any, kernels: Kernels, dtype: torch.dtype, device: torch.device, comm: Any | None = None
    ) -> None:
        """:raises ValueError: with a tensor-parallel ``comm``: the fused projections as stored
        are not split over ranks yet."""
        if comm is not None:
            raise ValueError("Phi-3 does not support tensor parallelism yet: use tensor_parallel_size=1")
        super().__init__(config, kernels, dtype, device)
