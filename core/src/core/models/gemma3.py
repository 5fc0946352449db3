"""Gemma 3 text decoder (``Gemma3ForCausalLM``, the ``gemma3_text`` configs).

What differs from the Llama family it builds on: local (sliding-window) and global
attention layers as ``config.layer_types`` lists them, each kind with its own rope
base; RMS-normalized q and k heads; a softmax scale of ``query_pre_attn_scalar ** -0.5``;
Gemma's RMSNorm, ``x / rms(x) * (1 + w)``, with four norms a layer (before and after
attention and the MLP); a GELU (tanh) gated MLP; token embeddings scaled by
``sqrt(hidden_size)``, tied to the output; and tanh soft-capping of the final logits
where the config sets ``final_logit_softcapping``.

The native fused runners describe only the Llama family, so this model has no
``describe()`` and runs eagerly, layer by layer, on the platform's kernels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from plugins.attention import AttentionMetadata
from plugins.kernels import GGUFWeight, Kernels
from torch import nn

from core.models.layers import Attention, GatedMLP, RMSNorm
from core.models.llama import LlamaForCausalLM
from core.models.rope import build_cos_sin_cache
from core.partition.pipeline import PipelineStage

_LAYER_TYPES = ("sliding_attention", "full_attention")


class Gemma3DecoderLayer(nn.Module):
    """``h += post_attn_norm(attn(input_norm(h)))``; ``h += post_ffw_norm(mlp(pre_ffw_norm(h)))``."""

    def __init__(self, config: Any, kernels: Kernels, head_size: int, layer_type: str) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(kernels, eps)
        self.self_attn = Attention.from_config(
            config,
            kernels,
            head_size,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            scale=config.query_pre_attn_scalar**-0.5,
            sliding_window=config.sliding_window if layer_type == "sliding_attention" else None,
            qk_norm_eps=eps,
        )
        self.post_attention_layernorm = RMSNorm(kernels, eps)
        self.pre_feedforward_layernorm = RMSNorm(kernels, eps)
        self.post_feedforward_layernorm = RMSNorm(kernels, eps)
        self.mlp = GatedMLP(kernels, config.hidden_size, config.intermediate_size, False, config.hidden_activation)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, ...],
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns ``(this layer's MLP output, the residual stream before it)``; the next
        norm adds the two (as the Llama layers do)."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden, kv_cache, meta, cos_sin_cache))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


#: Gemma 3's chat format for text (a system message opens the first user turn), as its
#: Hugging Face tokenizer_config.json writes it
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3's text decoder on a platform's kernels (see the module docstring)."""

    #: no Llama-family description for native runners: run eagerly
    describe = None
    default_chat_template = CHAT_TEMPLATE
    end_of_turn_tokens = ("<end_of_turn>",)

    def __init__(
        self,
        config: Any,
        kernels: Kernels,
        dtype: torch.dtype,
        device: torch.device,
        comm: Any | None = None,
        stage: PipelineStage | None = None,
    ) -> None:
        """:raises ValueError: for a config this decoder cannot run, a tensor-parallel
        communicator ``comm`` or a pipeline ``stage`` (Gemma 3's layers are not split over ranks)."""
        if comm is not None:
            raise ValueError("Gemma 3 does not support tensor parallelism yet: use tensor_parallel_size=1")
        if stage is not None:
            raise ValueError("Gemma 3 does not support pipeline parallelism yet: use pipeline_parallel_size=1")
        layer_types = list(getattr(config, "layer_types", None) or [])
        unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
        if len(layer_types) != config.num_hidden_layers or unknown:
            raise ValueError(f"Gemma 3 config needs one of {_LAYER_TYPES} per layer in layer_types; got {layer_types}")
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError("attention logit soft-capping (attn_logit_softcapping) is not supported")
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("bidirectional attention (use_bidirectional_attention) is not supported")
        super().__init__(config, kernels, dtype, device)
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype, device=self.device)
        self.local_cos_sin_cache = self.rope_table("sliding_attention")
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)

    def rope_table(self, layer_type: str = "full_attention") -> torch.Tensor:
        """The cos/sin table of the layers of ``layer_type`` (each kind has its own rope base)."""
        return build_cos_sin_cache(
            self.config, self.head_size, self.config.max_position_embeddings, self.dtype, self.device,
            layer_type=layer_type,
        )  # fmt: skip

    @classmethod
    def layer_windows(cls, config: Any) -> list[int | None]:
        return [config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]

    def make_layer(self, index: int, qkv_bias: bool, o_bias: bool) -> nn.Module:
        return Gemma3DecoderLayer(self.config, self.kernels, self.head_size, self.config.layer_types[index])

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, ...]],
        attn_metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Final (normed) hidden states ``[T, hidden_size]`` of the batch's new tokens."""
        hidden = F.embedding(input_ids, self.embed_tokens) * self.embed_scale
        residual = None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            local = layer.self_attn.sliding_window is not None
            table = self.local_cos_sin_cache if local else self.cos_sin_cache
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata, table)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits, soft-capped as ``cap * tanh(logits / cap)`` where the config sets a cap."""
        logits = self.lm_head(hidden).float()
        cap = self.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor | GGUFWeight]], quantization: str | None = None
    ) -> None:
        """As the Llama family's; then every norm holds Gemma's ``1 + w`` (in float32, as
        transformers computes it), so the kernels' plain RMSNorm applies."""
        super().load_weights(weights, quantization)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.weight = 1.0 + module.weight.float()
