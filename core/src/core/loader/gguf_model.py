"""Everything a GGUF file holds, in the engine's terms: HF config, named weights, tokenizer."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from plugins.kernels import GGUFWeight
from tqdm.auto import tqdm
from transformers import (
    AutoTokenizer,
    Gemma3TextConfig,
    LlamaConfig,
    MixtralConfig,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

from core.loader.cache import cache_root, file_key
from core.loader.gguf_index import GGUFIndex
from core.partition.sharding import ShardPlan, gguf_byte_columns

logger = logging.getLogger(__name__)

# GGUF architecture -> (HF config class, HF architecture name); llama.cpp's "llama" with
# experts is Mixtral
_ARCHITECTURES = {
    "llama": (LlamaConfig, "LlamaForCausalLM"),
    "qwen2": (Qwen2Config, "Qwen2ForCausalLM"),
    "qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
    "qwen3moe": (Qwen3MoeConfig, "Qwen3MoeForCausalLM"),
    "gemma3": (Gemma3TextConfig, "Gemma3ForCausalLM"),
}
_MIXTRAL = (MixtralConfig, "MixtralForCausalLM")
_TOP_LEVEL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs.weight",  # Llama 3 rope scaling: divisors of the inverse frequencies
}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3
    "attn_k_norm": "self_attn.k_norm",
    # mixture-of-experts layers: the router and every expert's projections stacked ([E, rows, cols])
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.gate_proj",
    "ffn_up_exps": "mlp.experts.up_proj",
    "ffn_down_exps": "mlp.experts.down_proj",
}
# Gemma 3 names its pre-MLP norm ffn_norm and has two more norms a layer, and q/k norms
_GEMMA3_BLOCK_NAMES = {
    **_BLOCK_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_BLOCK_NAMES_BY_ARCH = {"gemma3": _GEMMA3_BLOCK_NAMES}
# parts that the model fuses into one linear: they must share a quantization type
_FUSED_GROUPS = (("attn_q", "attn_k", "attn_v"), ("ffn_gate", "ffn_up"), ("ffn_gate_exps", "ffn_up_exps"))


def gguf_config(index: GGUFIndex) -> Any:
    """Build the transformers config (``LlamaConfig``, ``Qwen2Config``, ...) from GGUF metadata."""
    meta = index.metadata
    arch = meta.get("general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(sorted(_ARCHITECTURES))}")
    num_experts = meta.get(f"{arch}.expert_count", 0)
    config_class, hf_arch = _MIXTRAL if arch == "llama" and num_experts else _ARCHITECTURES[arch]
    num_heads = meta[f"{arch}.attention.head_count"]
    hidden = meta[f"{arch}.embedding_length"]
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    rope_scaling = None
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(meta[f"{arch}.rope.scaling.factor"])}
    elif scaling_type != "none":
        raise ValueError(f"GGUF rope scaling {scaling_type!r} is not supported; supported: none, linear")
    extra = {}
    if arch == "gemma3":  # transformers' defaults for the rest (query_pre_attn_scalar, the layer pattern)
        extra = {"sliding_window": meta.get(f"{arch}.attention.sliding_window", 4096)}
    elif num_experts:
        extra = _moe_config(index, arch, num_experts)
    return config_class(
        **extra,
        vocab_size=index.tensors["token_embd.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=meta[f"{arch}.feed_forward_length"],
        num_hidden_layers=meta[f"{arch}.block_count"],
        num_attention_heads=num_heads,
        num_key_value_heads=meta.get(f"{arch}.attention.head_count_kv", num_heads),
        head_dim=meta.get(
            f"{arch}.attention.key_length", meta.get(f"{arch}.rope.dimension_count", hidden // num_heads)
        ),
        max_position_embeddings=meta.get(f"{arch}.context_length", 2048),
        rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in index.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        architectures=[hf_arch],
    )


def _moe_config(index: GGUFIndex, arch: str, num_experts: int) -> dict[str, Any]:
    """The mixture-of-experts fields of a Mixtral or Qwen3-MoE config: layers without a router
    (``ffn_gate_inp``) are dense."""
    meta, top_k = index.metadata, index.metadata[f"{arch}.expert_used_count"]
    if arch == "llama":
        return {"num_local_experts": num_experts, "num_experts_per_tok": top_k}
    num_layers = meta[f"{arch}.block_count"]
    return {
        "num_experts": num_experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": meta[f"{arch}.expert_feed_forward_length"],
        "norm_topk_prob": bool(meta.get(f"{arch}.expert_weights_norm", True)),  # llama.cpp's default for qwen3moe
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(num_layers) if f"blk.{i}.ffn_gate_inp.weight" not in index.tensors],
    }


def _hf_name(gguf_name: str, arch: str) -> str | None:
    if gguf_name in _TOP_LEVEL_NAMES:
        return _TOP_LEVEL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    names = _BLOCK_NAMES_BY_ARCH.get(arch, _BLOCK_NAMES)
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    return None


def _unpermute_rows(rows: int, num_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (interleaved rope -> rotate-half)."""
    head_size = rows // num_heads
    return torch.arange(rows).reshape(num_heads, head_size // 2, 2).transpose(1, 2).reshape(-1)


def _keep_quantized(index: GGUFIndex, name: str) -> bool:
    """A quantized linear weight stays quantized unless a fused partner has another qtype."""
    if not index.tensors[name].is_quantized or name == "token_embd.weight":
        return False  # the embedding is a lookup table: dequantized
    if name.startswith("blk."):
        _, layer, kind, _ = name.split(".")
        for group in _FUSED_GROUPS:
            if kind in group:
                return len({index.tensors[f"blk.{layer}.{k}.weight"].qtype for k in group}) == 1
    return True


def gguf_weights(
    index: GGUFIndex,
    config: Any,
    keep_gguf: bool,
    dtype: torch.dtype,
    device: torch.device,
    plan: ShardPlan | None = None,
    byte_order: str = "little",
    held: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor | GGUFWeight]]:
    """Yield ``(HF name, weight)``: dense tensors in ``dtype``, or :class:`GGUFWeight` when ``keep_gguf``,
    their numbers in the platform's ``byte_order`` (:attr:`plugins.Platform.byte_order`).

    Llama q/k rows are put back in Hugging Face order, so the model's rotate-half rope applies.
    With a tensor-parallel ``plan`` only this rank's slice of each tensor is read; with
    ``held``, only the tensors it is true of (by Hugging Face name: a pipeline stage's).
    Gemma norms are stored as llama.cpp applies them, ``1 + w``: ``w`` is given back, as
    Hugging Face checkpoints hold it.
    """
    arch = index.metadata.get("general.architecture")
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for name in tqdm(index.tensors, desc="Loading GGUF weights", unit="tensor"):
        hf_name = _hf_name(name, arch)
        if hf_name is None:
            raise ValueError(f"unexpected tensor {name!r} in GGUF file {index.path}")
        if held is not None and not held(hf_name):
            continue
        keep = keep_gguf and _keep_quantized(index, name)
        yield hf_name, _read(index, name, hf_name, keep, arch, dtype, device, plan, heads, byte_order)
        info = index.tensors[name]
        tied_head = keep_gguf and config.tie_word_embeddings and (held is None or held("lm_head.weight"))
        if name == "token_embd.weight" and tied_head and info.is_quantized:
            # the tied output projection is the largest matmul: keep it in its quantized form
            yield (
                "lm_head.weight",
                _read(index, name, "lm_head.weight", True, arch, dtype, device, plan, {}, byte_order),
            )


def _read(
    index: GGUFIndex,
    name: str,
    hf_name: str,
    quantized: bool,
    arch: str | None,
    dtype: torch.dtype,
    device: torch.device,
    plan: ShardPlan | None,
    heads: dict[str, int],
    byte_order: str,
) -> torch.Tensor | GGUFWeight:
    """One tensor (this rank's slice of it), in its stored form or dense, its numbers in
    ``byte_order``; llama q/k rows unpermuted, Gemma norms ``w`` (llama.cpp stores ``1 + w``)."""
    info = index.tensors[name]
    part = plan.slice_for(hf_name) if plan is not None else None
    rows, byte_cols, num_cols = slice(None), slice(None), info.shape[-1]
    if part is not None and not part.zero:
        if part.dim == 0 and len(info.shape) == 3:  # a stack of experts' matrices: rows of each
            per_expert = info.shape[1]
            rows = np.concatenate([np.arange(e * per_expert + part.start, e * per_expert + part.stop)
                                   for e in range(info.shape[0])])  # fmt: skip
        elif part.dim == 0 and len(info.shape) > 1:
            rows = slice(part.start, part.stop)
        else:  # input columns, or the elements of a 1-D tensor
            byte_cols = slice(*gguf_byte_columns(info.qtype, info.shape[-1], part))
            num_cols = part.stop - part.start
    kind = name.split(".")[2] if name.startswith("blk.") else ""
    order = None
    if arch == "llama" and kind in heads:  # llama.cpp permuted q/k rows in each head; a rank's heads are whole
        num_rows = len(range(info.shape[0])[rows])
        order = _unpermute_rows(num_rows, heads[kind] * num_rows // info.shape[0])
    if quantized:
        data = index.raw(name, rows, byte_cols, byte_order)
        data = data[order] if order is not None else data
        return GGUFWeight(info.qtype, data.to(device), rows=data.shape[0], cols=num_cols)
    values = index.dequantized(name, rows, byte_cols, byte_order)
    values = values[order] if order is not None else values
    if part is not None and part.zero:
        values = torch.zeros_like(values)
    if arch == "gemma3" and name.endswith("norm.weight"):
        values = values - 1
    # rope frequency divisors stay float32: they feed the cos/sin table, not a matmul
    return values.to(device=device, dtype=torch.float32 if kind == "" and "rope" in name else dtype)


def gguf_tokenizer(path: Path, chat_template: str | None) -> PreTrainedTokenizerBase:
    """The tokenizer transformers builds from the GGUF vocabulary, cached after the first build."""
    cached = cache_root() / "tokenizers" / file_key(path)
    if (cached / "tokenizer_config.json").exists():
        try:
            tokenizer = AutoTokenizer.from_pretrained(cached)
        except (OSError, ValueError) as err:
            logger.warning("ignoring unreadable cached tokenizer %s: %s", cached, err)
        else:
            return _with_template(tokenizer, chat_template)
    logger.info("converting the GGUF tokenizer of %s (once; cached in %s)", path.name, cached)
    tokenizer = _with_template(AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name), chat_template)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
        tokenizer.save_pretrained(tmp)
        if cached.exists():
            shutil.rmtree(cached)
        tmp.rename(cached)
    except OSError as err:  # a read-only cache only costs speed
        logger.warning("could not cache the converted tokenizer at %s: %s", cached, err)
    return tokenizer


def _with_template(tokenizer: PreTrainedTokenizerBase, chat_template: str | None) -> PreTrainedTokenizerBase:
    if chat_template and not tokenizer.chat_template:
        tokenizer.chat_template = chat_template
    return tokenizer
