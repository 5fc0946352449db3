"""BERT encoders (``BertModel``, ``BertForSequenceClassification``) for pooling.

Absolute position and token-type embeddings, post-norm layers (LayerNorm after each residual
add), GELU, and bidirectional attention within each sequence through the platform's
``kernels.encoder_attention``. There is no KV cache: a step's sequences are encoded whole.
Weights arrive under Hugging Face names, with or without the ``bert.`` prefix of task
heads; q/k/v are fused into one linear as they arrive.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from plugins.kernels import Kernels
from torch import nn

from core.models.layers import Linear, concat_rows, held_bytes
from core.partition.tensor_parallel import TensorParallel

# hidden_act -> GELU's ``approximate`` (the up-projection runs as ``kernels.linear_gelu``), None: ReLU
_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "relu": None}
_LAYER = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)")
# HF module name -> ours (q/k/v are fused into qkv)
_MODULES = {
    "attention.output.dense": "o_proj",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "up_proj",
    "output.dense": "down_proj",
    "output.LayerNorm": "mlp_norm",
}
_QKV = {"attention.self.query": 0, "attention.self.key": 1, "attention.self.value": 2}
_IGNORED = {"embeddings.position_ids"}


class LayerNorm(nn.Module):
    """``layer_norm(x) * weight + bias`` over the last dimension (weights set at load)."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class BertLayer(nn.Module):
    """Attention, add & norm, MLP, add & norm (post-norm)."""

    def __init__(self, config: Any, kernels: Kernels) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        self.kernels = kernels
        self.num_heads = config.num_attention_heads
        self.head_size = hidden // self.num_heads
        self.scale = self.head_size**-0.5
        self.qkv_proj = Linear(kernels, hidden, 3 * hidden, has_bias=True)
        self.o_proj = Linear(kernels, hidden, hidden, has_bias=True)
        self.attn_norm = LayerNorm(config.layer_norm_eps)
        self.up_proj = Linear(kernels, hidden, inter, has_bias=True)
        self.down_proj = Linear(kernels, inter, hidden, has_bias=True)
        self.mlp_norm = LayerNorm(config.layer_norm_eps)
        self.gelu = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: list[int]) -> torch.Tensor:
        num_tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).view(num_tokens, 3, self.num_heads, self.head_size).unbind(1)
        attn = self.kernels.encoder_attention(q, k, v, query_start_loc, seq_lens, self.scale)
        hidden = self.attn_norm(hidden + self.o_proj(attn.reshape(num_tokens, -1)))
        if self.gelu is None:
            up = F.relu(self.up_proj(hidden))
        else:
            up = self.kernels.linear_gelu(hidden, self.up_proj.weight, self.up_proj.bias, self.gelu)
        return self.mlp_norm(hidden + self.down_proj(up))


class BertModel(nn.Module):
    """A BERT encoder on a platform's kernels.

    Call ``model(input_ids, positions, token_type_ids, query_start_loc, seq_lens)`` on a flattened
    batch (as :meth:`plugins.kernels.Kernels.encoder_attention` lays it out) for the last layer's
    hidden states ``[T, hidden_size]``; :meth:`classify` turns pooled rows into a head's logits.
    """

    #: the model is run by the pooling runner (``--runner auto`` picks it)
    is_pooling_model = True
    default_chat_template: str | None = None
    end_of_turn_tokens: tuple[str, ...] = ()

    @classmethod
    def layer_windows(cls, config: Any) -> list[int | None]:
        return [None] * config.num_hidden_layers

    def __init__(
        self, config: Any, kernels: Kernels, dtype: torch.dtype, device: torch.device, comm: Any | None = None
    ) -> None:
        super().__init__()
        if comm is not None:
            raise ValueError(f"{type(self).__name__} cannot be split over tensor-parallel ranks: use one rank")
        if config.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported BERT activation {config.hidden_act!r}; supported: {', '.join(_ACTIVATIONS)}")
        if getattr(config, "position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"unsupported position_embedding_type {config.position_embedding_type!r}: absolute only")
        self.config = config
        self.kernels = kernels
        self.dtype = dtype
        self.device = torch.device(device)
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_attention_heads
        self.head_size = config.hidden_size // config.num_attention_heads
        # one rank: the loader reads every tensor whole
        dims = SimpleNamespace(
            num_attention_heads=self.num_kv_heads,
            num_key_value_heads=self.num_kv_heads,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
        )
        self.tp = TensorParallel.build(dims, self.head_size, None)
        self.layers = nn.ModuleList(BertLayer(config, kernels) for _ in range(self.num_layers))
        self.embeddings: dict[str, torch.Tensor] = {}
        self.embed_norm = LayerNorm(config.layer_norm_eps)
        self.pooler = Linear(kernels, config.hidden_size, config.hidden_size, has_bias=True)
        self.classifier: Linear | None = None  # a task head (:class:`BertForSequenceClassification`)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        token_type_ids: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: list[int],
    ) -> torch.Tensor:
        """Last-layer hidden states ``[T, hidden_size]`` of the batch's tokens."""
        emb = self.embeddings
        hidden = emb["word"][input_ids] + emb["position"][positions] + emb["token_type"][token_type_ids]
        hidden = self.embed_norm(hidden)
        for layer in self.layers:
            hidden = layer(hidden, query_start_loc, seq_lens)
        return hidden

    def classify(self, first_tokens: torch.Tensor) -> torch.Tensor:
        """float32 logits ``[N, num_labels]`` of the classification head for each sequence's first ([CLS]) row."""
        if self.classifier is None:
            raise ValueError(f"{self.config.architectures} has no classification head")
        return self.classifier(torch.tanh(self.pooler(first_tokens))).float()

    def weights_bytes(self) -> int:
        """Bytes of every weight as held."""
        seen: set[int] = set()
        total = held_bytes(self.embeddings, seen)
        for module in self.modules():
            if isinstance(module, (Linear, LayerNorm)):
                total += held_bytes(module.weight, seen) + held_bytes(module.bias, seen)
        return total

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], quantization: str | None = None) -> None:
        """Take every weight under its Hugging Face name (``bert.`` prefix optional); fuse q/k/v."""
        pending: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
        linears: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in weights:
            name = name.removeprefix("bert.")
            if name in _IGNORED:
                continue
            if name.startswith("embeddings."):
                self._load_embedding(name, tensor)
            elif name.startswith(("pooler.dense.", "classifier.")):
                target, kind = name.replace("pooler.dense", "pooler").rsplit(".", 1)
                if target == "classifier" and self.classifier is None:
                    continue  # a head this architecture does not run
                linears.setdefault(target, {})[kind] = tensor
            elif match := _LAYER.fullmatch(name):
                index, module, kind = (
                    int(match[1]),
                    match[2],
                    {"gamma": "weight", "beta": "bias"}.get(match[3], match[3]),
                )
                if index >= self.num_layers:
                    raise ValueError(f"weight {name!r} is for layer {index}, the model has {self.num_layers}")
                if module in _QKV:
                    parts = pending.setdefault((index, kind), {})
                    parts[_QKV[module]] = tensor
                    if len(parts) < 3:
                        continue
                    tensor, module = concat_rows([parts[i] for i in range(3)]), "qkv_proj"
                    del pending[(index, kind)]
                elif module in _MODULES:
                    module = _MODULES[module]
                else:
                    raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
                target = f"layers.{index}.{module}"
                if module.endswith("_norm"):
                    setattr(self.get_submodule(target), kind, tensor)
                else:
                    linears.setdefault(target, {})[kind] = tensor
            else:
                raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
        if pending:
            raise ValueError(f"incomplete q/k/v weights of layers {sorted({i for i, _ in pending})}")
        for target, parts in linears.items():
            if "weight" not in parts:
                raise ValueError(f"bias without a weight: {target}")
            self.get_submodule(target).load(parts["weight"], parts.get("bias"), quantization)
        self._check_complete()

    def _load_embedding(self, name: str, tensor: torch.Tensor) -> None:
        kinds = {"word_embeddings": "word", "position_embeddings": "position", "token_type_embeddings": "token_type"}
        module, kind = name.removeprefix("embeddings.").rsplit(".", 1)
        if module in kinds and kind == "weight":
            self.embeddings[kinds[module]] = tensor
        elif module == "LayerNorm":
            setattr(self.embed_norm, {"gamma": "weight", "beta": "bias"}.get(kind, kind), tensor)
        else:
            raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")

    def _check_complete(self) -> None:
        missing = [k for k in ("word", "position", "token_type") if k not in self.embeddings]
        for name, module in self.named_modules():
            if isinstance(module, (Linear, LayerNorm)) and module.weight is None and module is not self.pooler:
                missing.append(name)
        if self.classifier is not None and self.pooler.weight is None:
            missing.append("pooler")
        if missing:
            raise ValueError(f"checkpoint is missing weights for: {', '.join(missing)}")


class BertForSequenceClassification(BertModel):
    """BERT with its pooler and classification head of ``config.num_labels`` outputs (cross-encoders, classifiers)."""

    def __init__(
        self, config: Any, kernels: Kernels, dtype: torch.dtype, device: torch.device, comm: Any | None = None
    ) -> None:
        super().__init__(config, kernels, dtype, device, comm)
        self.classifier = Linear(kernels, config.hidden_size, config.num_labels, has_bias=True)
