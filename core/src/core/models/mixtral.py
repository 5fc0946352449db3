"""Mixtral: the Mistral decoder with a mixture of experts in every layer (top-k renormalized)."""

from __future__ import annotations

import re

from torch import nn

from core.models.mistral import MistralForCausalLM
from core.models.moe import SparseMoE, expert_size

# Mixtral's checkpoint names -> the names the MoE layer takes (Qwen3-MoE's)
_RENAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT = re.compile(r"\.block_sparse_moe\.(?:(experts\.\d+)\.(w[123])|(gate))\.")


class MixtralForCausalLM(MistralForCausalLM):
    """Mixtral causal LM: ``num_experts_per_tok`` of ``num_local_experts`` experts a token."""

    def make_mlp(self, index: int) -> nn.Module | None:
        config = self.config
        size = expert_size(config, config.intermediate_size, self.tp.plan.world_size)
        return SparseMoE(self.kernels, config.hidden_size, config.num_local_experts, config.num_experts_per_tok, size,
                         True, self.tp)  # fmt: skip

    @staticmethod
    def hf_name(name: str) -> str:
        """``block_sparse_moe.experts.E.w1`` -> ``mlp.experts.E.gate_proj`` (w3: up, w2: down); the router ``mlp.gate``."""

        def rename(match: re.Match) -> str:
            if match[3]:
                return ".mlp.gate."
            return f".mlp.{match[1]}.{_RENAMES[match[2]]}."

        return _EXPERT.sub(rename, name)
