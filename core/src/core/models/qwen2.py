"""Qwen2: the Llama decoder with biases on the q/k/v projections (none on the output)."""

from __future__ import annotations

from typing import Any

from core.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5 causal LM."""

    @staticmethod
    def attention_biases(config: Any) -> tuple[bool, bool]:
        return True, False
