"""Qwen3 (dense) and Qwen3-MoE: the Llama decoder with each q and k head RMS-normalized
before the rotation; Qwen3-MoE's sparse layers route each token to its top experts."""

from __future__ import annotations

from typing import Any

from torch import nn

from core.models.llama import LlamaForCausalLM
from core.models.moe import SparseMoE, expert_size


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 causal LM (per-head q/k RMSNorm; biases as ``attention_bias`` says, none by default)."""

    has_qk_norm = True


def is_sparse_layer(config: Any, index: int) -> bool:
    """Whether Qwen3-MoE layer ``index`` is a mixture of experts (else a dense MLP), as transformers decides."""
    step = config.decoder_sparse_step
    return index not in (config.mlp_only_layers or []) and config.num_experts > 0 and (index + 1) % step == 0


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE causal LM: sparse layers by ``decoder_sparse_step`` and ``mlp_only_layers``,
    ``num_experts_per_tok`` of ``num_experts`` experts a token, renormalized when ``norm_topk_prob``."""

    def make_mlp(self, index: int) -> nn.Module | None:
        config = self.config
        if not is_sparse_layer(config, index):
            return None
        size = expert_size(config, config.moe_intermediate_size, self.tp.plan.world_size)
        return SparseMoE(self.kernels, config.hidden_size, config.num_experts, config.num_experts_per_tok, size,
                         config.norm_topk_prob, self.tp)  # fmt: skip
