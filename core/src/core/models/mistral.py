"""Mistral: the Llama decoder with every layer attending within ``config.sliding_window``
(when the config sets one): the whole context is served, and KV blocks older than the
window are given back as a sequence grows (:meth:`core.block_manager.BlockManager.free_before`)."""

from __future__ import annotations

from typing import Any

from core.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral causal LM: sliding-window attention in every layer."""

    @classmethod
    def layer_windows(cls, config: Any) -> list[int | None]:
        return [getattr(config, "sliding_window", None) or None] * config.num_hidden_layers
