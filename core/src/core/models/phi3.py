"""Phi-3: the Llama decoder with q/k/v and gate/up stored fused (``qkv_proj``, ``gate_up_proj``,
the layout this engine runs anyway), every layer within ``config.sliding_window`` where the
config sets one, and LongRoPE scaling (:mod:`core.models.rope`)."""

from __future__ import annotations

from core.models.mistral import MistralForCausalLM


class Phi3ForCausalLM(MistralForCausalLM):
    """Phi-3 causal LM (Phi-3 mini/small/medium, Phi-3.5 mini). Under tensor parallelism each rank
    reads its rows of every part of the fused projections (:class:`core.partition.sharding.FusedRows`)."""
