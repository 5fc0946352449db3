"""Mistral: the Llama decoder as is (its sliding window is handled by capping the context length)."""

from __future__ import annotations

from core.models.llama import LlamaForCausalLM


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral causal LM; ``max_model_len`` is capped at ``sliding_window`` by the loader."""
