"""Llama-family decoder (Llama 2/3, SmolLM, TinyLlama); Qwen2 and Mistral reuse it with flags.

Weights arrive as ``(name, tensor)`` pairs under Hugging Face names
(``model.layers.0.self_attn.q_proj.weight``); q/k/v and gate/up are fused into one
linear each as their parts arrive.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.kernels import GGUFWeight, Kernels
from plugins.model import LayerDescription, LinearWeights, ModelDescription, MoEWeights
from torch import nn

from core.models.layers import Attention, GatedMLP, Linear, RMSNorm, concat_rows, held_bytes
from core.models.moe import SparseMoE
from core.models.rope import build_cos_sin_cache
from core.partition.pipeline import PipelineStage
from core.partition.tensor_parallel import TensorParallel

logger = logging.getLogger(__name__)

# HF projection name -> (our fused linear, index of the part, number of parts)
_FUSED_PARTS = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0, 3),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1, 3),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2, 3),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0, 2),
    "mlp.up_proj": ("mlp.gate_up_proj", 1, 2),
}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def _linear(module: Linear) -> LinearWeights:
    lora = module.lora and module.lora.describe()
    return LinearWeights(module.weight, module.bias, module.in_features, module.out_features, lora)


def _describe_mlp(mlp: nn.Module) -> dict[str, Any]:
    """The ``gate_up``, ``down`` and ``moe`` fields of a layer's description."""
    if isinstance(mlp, SparseMoE):
        moe = MoEWeights(_linear(mlp.gate), mlp.experts, mlp.num_experts, mlp.top_k, mlp.renormalize,
                         mlp.intermediate_size)  # fmt: skip
        return {"gate_up": None, "down": None, "moe": moe}
    return {"gate_up": _linear(mlp.gate_up_proj), "down": _linear(mlp.down_proj)}


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention + MLP, with the residual add fused into the norms.

    ``qk_norm_eps``: RMS-normalize each q and k head (Qwen3); ``mlp``: the layer's MLP
    (default: a gated MLP of the config's ``intermediate_size``, split over ranks).
    """

    def __init__(
        self,
        config: Any,
        kernels: Kernels,
        head_size: int,
        qkv_bias: bool,
        o_bias: bool,
        tp: TensorParallel,
        sliding_window: int | None = None,
        qk_norm_eps: float | None = None,
        mlp: nn.Module | None = None,
    ) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        plan = tp.plan
        self.input_layernorm = RMSNorm(kernels, eps)
        self.self_attn = Attention(
            kernels,
            config.hidden_size,
            plan.num_heads,
            plan.num_kv_heads,
            head_size,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            sliding_window=sliding_window,
            qk_norm_eps=qk_norm_eps,
            tp=tp,
        )
        self.post_attention_layernorm = RMSNorm(kernels, eps)
        if mlp is None:
            mlp_bias = getattr(config, "mlp_bias", False)
            mlp = GatedMLP(kernels, config.hidden_size, plan.intermediate_size, mlp_bias, tp=tp)
        self.mlp = mlp

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: tuple[torch.Tensor, ...],
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta, cos_sin_cache)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    """A Llama-architecture causal LM running on a platform's kernels.

    Call ``model(input_ids, positions, kv_caches, attn_metadata)`` for the final hidden
    states of a flattened batch, then :meth:`compute_logits` on the rows to sample.
    With a communicator ``comm`` the model is this rank's tensor-parallel shard
    (:mod:`core.partition.sharding`); its KV caches hold its own KV heads. With a pipeline
    ``stage`` it holds that stage's layers only (``num_layers`` of them, one KV cache each), the
    embedding on the first stage, the final norm and LM head on the last
    (:mod:`core.partition.pipeline`): a stage after the first takes the previous stage's hidden
    states and residual (``intermediate``), and a stage before the last returns its own.
    """

    #: the chat template of a checkpoint that brings none (a GGUF file without
    #: ``tokenizer.chat_template``), as llama.cpp falls back to its template for the architecture
    default_chat_template: str | None = None
    #: tokens that end a chat turn, stop tokens beside the checkpoint's EOS where the vocabulary has them
    end_of_turn_tokens: tuple[str, ...] = ()
    #: whether each q and k head is RMS-normalized before the rotation (Qwen3)
    has_qk_norm: bool = False

    @classmethod
    def layer_windows(cls, config: Any) -> list[int | None]:
        """Each layer's attention window in tokens (None: the whole context), from the config alone.
        A class whose layers have none ignores ``config.sliding_window``: the loader caps the length at it."""
        return [None] * config.num_hidden_layers

    def __init__(
        self,
        config: Any,
        kernels: Kernels,
        dtype: torch.dtype,
        device: torch.device,
        comm: Any | None = None,
        stage: PipelineStage | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.kernels = kernels
        self.dtype = dtype
        self.device = torch.device(device)
        self.stage = stage or PipelineStage.whole(config.num_hidden_layers)
        self.num_layers = self.stage.stop - self.stage.start
        self.head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.tp = TensorParallel.build(config, self.head_size, comm)
        self.num_kv_heads = self.tp.plan.num_kv_heads
        qkv_bias, o_bias = self.attention_biases(config)
        self.layers = nn.ModuleList(
            self.make_layer(i, qkv_bias, o_bias) for i in range(self.stage.start, self.stage.stop)
        )
        self.norm: RMSNorm | None = None
        self.lm_head: Linear | None = None
        if self.stage.is_last:
            self.norm = RMSNorm(kernels, config.rms_norm_eps)
            vocab_part = self.tp.plan.vocab_stop - self.tp.plan.vocab_start
            self.lm_head = Linear(kernels, config.hidden_size, vocab_part, has_bias=False)
        self.embed_tokens: torch.Tensor | None = None
        self.cos_sin_cache = self.rope_table()

    def rope_table(self) -> torch.Tensor:
        """The rotary cos/sin table of the config (see :func:`core.models.rope.build_cos_sin_cache`)."""
        return build_cos_sin_cache(
            self.config, self.head_size, self.config.max_position_embeddings, self.dtype, self.device
        )

    def make_layer(self, index: int, qkv_bias: bool, o_bias: bool) -> nn.Module:
        """Decoder layer ``index`` (empty; weights come with :meth:`load_weights`)."""
        window = self.layer_windows(self.config)[index]
        qk_norm_eps = self.config.rms_norm_eps if self.has_qk_norm else None
        return LlamaDecoderLayer(
            self.config, self.kernels, self.head_size, qkv_bias, o_bias, self.tp, window, qk_norm_eps,
            self.make_mlp(index),
        )  # fmt: skip

    def make_mlp(self, index: int) -> nn.Module | None:
        """Layer ``index``'s MLP; None: the Llama gated MLP (mixture-of-experts models override this)."""
        return None

    @staticmethod
    def hf_name(name: str) -> str:
        """A checkpoint's weight name in this family's terms (identity; Mixtral renames its experts)."""
        return name

    @staticmethod
    def attention_biases(config: Any) -> tuple[bool, bool]:
        """Whether the qkv and the output projections carry a bias."""
        bias = bool(getattr(config, "attention_bias", False))
        return bias, bias

    def holds_weight(self, name: str) -> bool:
        """Whether this model (its pipeline stage) loads the weight with Hugging Face name ``name``
        (the loaders read no other: a stage reads its own layers only)."""
        return self.stage.holds(self.hf_name(name), bool(getattr(self.config, "tie_word_embeddings", False)))

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, ...]],
        attn_metadata: AttentionMetadata,
        intermediate: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final (normed) hidden states ``[T, hidden_size]`` of the batch's new tokens; on a
        pipeline stage before the last, its hidden states and residual ``[T, 2 * hidden_size]``.

        :param intermediate: a stage after the first: the previous stage's ``[T, 2 * hidden_size]``.
        """
        if self.stage.is_first:
            hidden, residual = self.tp.embed(input_ids, self.embed_tokens), None
        else:
            hidden, residual = (part.contiguous() for part in intermediate.split(self.config.hidden_size, dim=-1))
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, attn_metadata, self.cos_sin_cache)
        if not self.stage.is_last:
            return torch.cat([hidden, residual], dim=-1)
        hidden, _ = self.norm(hidden, residual)
        return hidden

    def describe(self, kv_caches: list[tuple[torch.Tensor, ...]]) -> ModelDescription:
        """This model (its pipeline stage's layers) and its KV caches as the SDK's explicit
        description (for native runners)."""
        if len(kv_caches) != self.num_layers:
            raise ValueError(f"describe() needs one (k, v) cache per layer: got {len(kv_caches)} for {self.num_layers}")
        config, attn0 = self.config, self.layers[0].self_attn
        # a split model's whole vocabulary; an unsplit one's the rows it holds (a padded table's too)
        split = self.tp.is_sharded or not self.stage.is_first
        vocab_size = self.tp.plan.vocab_size if split else self.embed_tokens.shape[0]
        layers = tuple(
            LayerDescription(
                input_norm=layer.input_layernorm.weight,
                post_attention_norm=layer.post_attention_layernorm.weight,
                qkv=_linear(layer.self_attn.qkv_proj),
                o=_linear(layer.self_attn.o_proj),
                **_describe_mlp(layer.mlp),
                k_cache=k_cache,
                v_cache=v_cache,
                kv_scale=kv_scale[0] if kv_scale else None,
                q_norm=layer.self_attn.q_norm and layer.self_attn.q_norm.weight,
                k_norm=layer.self_attn.k_norm and layer.self_attn.k_norm.weight,
            )
            for layer, (k_cache, v_cache, *kv_scale) in zip(self.layers, kv_caches, strict=True)
        )
        return ModelDescription(
            layers=layers,
            hidden_size=config.hidden_size,
            num_heads=attn0.num_heads,
            num_kv_heads=attn0.num_kv_heads,
            head_dim=self.head_size,
            intermediate_size=self.tp.plan.intermediate_size,
            vocab_size=vocab_size,
            rms_norm_eps=config.rms_norm_eps,
            attn_scale=attn0.scale,
            dtype=self.dtype,
            embedding=self.embed_tokens if self.stage.is_first else None,
            final_norm=self.norm.weight if self.stage.is_last else None,
            cos_sin=self.cos_sin_cache,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            sliding_window=self.layer_windows(config)[0],  # the Llama family's layers share one
            vocab_start=self.tp.plan.vocab_start,
            comm=self.tp.comm,
        )

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[N, vocab_size]`` for hidden states ``[N, hidden_size]``."""
        return self.tp.gather_logits(self.lm_head(hidden)).float()

    def weights_bytes(self) -> int:
        """Bytes of every weight as held (prepared linears included, tied weights once)."""
        seen: set[int] = set()
        total = held_bytes(self.embed_tokens, seen)
        for module in self.modules():
            if isinstance(module, (Linear, RMSNorm)):
                total += held_bytes(module.weight, seen)
            if isinstance(module, Linear):
                total += held_bytes(module.bias, seen)
            if isinstance(module, SparseMoE):
                total += held_bytes(module.experts, seen)
        return total

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor | GGUFWeight]], quantization: str | None = None
    ) -> None:
        """Take every weight under its Hugging Face name; fuse q/k/v and gate/up as they arrive.

        Dense tensors must already be in the compute dtype on the model's device.
        ``quantization`` is passed to ``kernels.prepare_linear`` for every linear weight
        (``"gguf"`` for :class:`GGUFWeight` ones).
        """
        pending: dict[tuple[str, str], dict[int, Any]] = {}
        biases: dict[str, torch.Tensor] = {}
        linears: dict[str, Any] = {}
        loaded: set[str] = set()
        for name, tensor in weights:
            name = self.hf_name(name)
            if _IGNORED.match(name):
                continue
            if not _LAYER_NAME.fullmatch(name) and not self.holds_weight(name):
                continue  # another pipeline stage's (embedding, final norm, LM head)
            if name == "model.embed_tokens.weight":
                self.embed_tokens = tensor
            elif name == "model.norm.weight":
                self.norm.weight = tensor
            elif name == "lm_head.weight":
                linears["lm_head"] = tensor
            elif name == "rope_freqs.weight":  # llama.cpp's Llama 3 rope scaling, as frequency divisors
                self.cos_sin_cache = build_cos_sin_cache(
                    self.config, self.head_size, self.config.max_position_embeddings, self.dtype, self.device, tensor
                )
            elif match := _LAYER_NAME.fullmatch(name):
                index, module, kind = int(match[1]), match[2], match[3]
                if index >= self.stage.num_layers:
                    raise ValueError(f"weight {name!r} is for layer {index}, the model has {self.stage.num_layers}")
                if not self.holds_weight(name):
                    continue  # another pipeline stage's layer
                prefix = f"layers.{index - self.stage.start}."
                if module.startswith("mlp.experts."):
                    mlp = self.layers[index].mlp
                    if not isinstance(mlp, SparseMoE) or kind != "weight":
                        raise ValueError(f"unexpected weight {name!r}: layer {index} has no experts")
                    mlp.add_part(module.removeprefix("mlp.experts."), tensor)
                    continue
                if module in _FUSED_PARTS:
                    fused, part, num_parts = _FUSED_PARTS[module]
                    parts = pending.setdefault((prefix + fused, kind), {})
                    parts[part] = tensor
                    if len(parts) < num_parts:
                        continue
                    tensor = concat_rows([parts[i] for i in range(num_parts)])
                    del pending[(prefix + fused, kind)]
                    module = fused
                target = prefix + module
                if module.endswith(("layernorm", "_norm")):  # the Gemma q/k norms too
                    self.get_submodule(target).weight = tensor
                elif kind == "bias":
                    biases[target] = tensor
                else:
                    linears[target] = tensor
            else:
                raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
            loaded.add(name)
        if pending:
            raise ValueError(f"incomplete fused weights (missing parts): {sorted(k for k, _ in pending)}")
        if "lm_head" not in linears and self.stage.is_last:
            if not getattr(self.config, "tie_word_embeddings", False):
                raise ValueError("checkpoint has no lm_head.weight and tie_word_embeddings is false")
            linears["lm_head"] = self.embed_tokens
        for target, weight in linears.items():
            self.get_submodule(target).load(weight, biases.pop(target, None), quantization)
        for module in self.modules():
            if isinstance(module, SparseMoE):
                module.load_experts(quantization)
        if biases:
            raise ValueError(f"biases without a weight: {sorted(biases)}")
        self._check_complete()

    def _check_complete(self) -> None:
        missing = [n for n, m in self.named_modules() if isinstance(m, (Linear, RMSNorm)) and m.weight is None]
        missing += [f"{n}.experts" for n, m in self.named_modules() if isinstance(m, SparseMoE) and m.experts is None]
        if self.embed_tokens is None and self.stage.is_first:
            missing.insert(0, "embed_tokens")
        if missing:
            raise ValueError(f"checkpoint is missing weights for: {', '.join(missing)}")
