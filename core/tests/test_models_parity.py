"""Our models vs transformers' forward on the same tiny random checkpoints (CPU, reference kernels)."""

from __future__ import annotations

import pytest
import torch
import transformers
from core.loader import load_model
from core.models.standalone import StandaloneRunner
from plugins.kernels import Kernels
from plugins.reference import TINY_MODEL
from transformers import LlamaConfig, MistralConfig, MixtralConfig, Phi3Config, Qwen2Config, Qwen3Config, Qwen3MoeConfig

#: the SDK's tiny decoder, with weights large enough that greedy choices are not near-ties
TINY = {**TINY_MODEL, "max_position_embeddings": 128, "initializer_range": 0.1, "bos_token_id": 1, "eos_token_id": 2}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
CONFIGS = {
    "llama-untied": lambda: LlamaConfig(**TINY, tie_word_embeddings=False),
    "llama-tied-llama3-rope": lambda: LlamaConfig(**TINY, tie_word_embeddings=True, rope_scaling=LLAMA3_ROPE),
    "llama-linear-rope-mha": lambda: LlamaConfig(
        **{**TINY, "num_key_value_heads": 4}, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
    "qwen2": lambda: Qwen2Config(**TINY, tie_word_embeddings=True),
    "mistral": lambda: MistralConfig(**TINY, sliding_window=None),
    "qwen3": lambda: Qwen3Config(**TINY, head_dim=16),
    # one dense layer (mlp_only_layers) among sparse ones; 3 of 8 experts, weights not renormalized
    "qwen3-moe": lambda: Qwen3MoeConfig(
        **{**TINY, "num_hidden_layers": 3},
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=3,
        mlp_only_layers=[1],
        norm_topk_prob=False,
    ),  # fmt: skip
    # every second layer sparse (decoder_sparse_step), renormalized
    "qwen3-moe-step2": lambda: Qwen3MoeConfig(
        **TINY,
        head_dim=16,
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        decoder_sparse_step=2,
        norm_topk_prob=True,
    ),  # fmt: skip
    "mixtral": lambda: MixtralConfig(**TINY, num_local_experts=4, num_experts_per_tok=2),
    # LongRoPE (short factors below original_max_position_embeddings, attention scaling from the ratio)
    "phi3-longrope": lambda: Phi3Config(
        **{**TINY, "max_position_embeddings": 256},
        pad_token_id=0,
        original_max_position_embeddings=64,
        rope_scaling={
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.1 * i for i in range(8)],
            "long_factor": [2.0 + i for i in range(8)],
        },
    ),  # fmt: skip
}
PROMPTS = [[5, 17, 33, 9, 100, 41, 7], [3, 150], [90, 12, 61, 22, 8, 77, 31, 45, 120, 11, 64, 5, 19, 2, 88, 140, 3, 9]]


def save_tiny(config, directory, **save_kwargs) -> transformers.PreTrainedModel:
    """Save a random-weight HF model (and a tokenizer-free copy is enough: we add a tokenizer)."""
    torch.manual_seed(0)
    hf_model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    hf_model.save_pretrained(directory, **save_kwargs)
    save_tokenizer(directory, config.vocab_size)
    return hf_model


def save_tokenizer(directory, vocab_size: int) -> None:
    """A word-level tokenizer over the tiny vocabulary (the loader needs one in the directory)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="w1", eos_token="w2", unk_token="w0")
    fast.save_pretrained(directory)


def hf_logits(hf_model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([tokens])).logits[0].float()


def check_parity(hf_model, loaded, prompts, num_steps=4, block_size=4, atol=1e-4) -> None:
    """Prefill all prompts in one batch, decode greedily, and compare every step with HF."""
    runner = StandaloneRunner(loaded.model, len(prompts), max(map(len, prompts)) + num_steps, block_size)
    tokens, step_logits = runner.greedy(prompts, num_steps)
    for i, prompt in enumerate(prompts):
        reference = hf_logits(hf_model, prompt + tokens[i][:-1])[len(prompt) - 1 :]
        ours = torch.stack([logits[i] for logits in step_logits])
        torch.testing.assert_close(ours, reference, atol=atol, rtol=0)
        assert tokens[i] == reference.argmax(-1).tolist()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_matches_transformers_fp32(name, tmp_path):
    hf_model = save_tiny(CONFIGS[name](), tmp_path)
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=torch.device("cpu"))
    assert type(loaded.model).__name__ == type(hf_model).__name__
    check_parity(hf_model, loaded, PROMPTS, block_size=4)
    # the same prompts one at a time, with another block size
    for prompt in PROMPTS[:2]:
        check_parity(hf_model, loaded, [prompt], block_size=16)


def test_sharded_checkpoint_and_metadata(tmp_path):
    config = CONFIGS["llama-untied"]()
    hf_model = save_tiny(config, tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=torch.device("cpu"))
    check_parity(hf_model, loaded, PROMPTS[:2], block_size=8)
    assert loaded.num_layers == 2 and loaded.num_kv_heads == 2 and loaded.head_size == 16
    assert loaded.max_model_len == 128
    assert loaded.eos_token_ids == [2]
    assert loaded.name == str(tmp_path)
    num_params = sum(p.numel() for p in hf_model.parameters())
    assert loaded.weights_bytes == num_params * 4


def test_tied_weights_counted_once(tmp_path):
    hf_model = save_tiny(CONFIGS["qwen2"](), tmp_path)
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=torch.device("cpu"))
    assert loaded.weights_bytes == sum(p.numel() for p in hf_model.parameters()) * 4  # parameters() dedupes


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_fp32(dtype, tmp_path):
    hf_model = save_tiny(CONFIGS["llama-tied-llama3-rope"](), tmp_path)
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=dtype, device=torch.device("cpu"))
    assert loaded.model.embed_tokens.dtype == dtype
    runner = StandaloneRunner(loaded.model, 1, 32, block_size=8)
    logits = runner.step([PROMPTS[0]])[0]
    assert logits.dtype == torch.float32
    reference = hf_logits(hf_model, PROMPTS[0])[-1]
    torch.testing.assert_close(logits, reference, atol=0.05 * reference.abs().max().item(), rtol=0)
    assert logits.argmax().item() == reference.argmax().item()


# -- Gemma 3: local (sliding-window) and global layers; windows smaller than the prompts
GEMMA_PROMPTS = [
    [5, 17, 33, 9, 100, 41, 7],
    [3, 150],
    [int(x) for x in torch.randint(3, 160, (23,), generator=torch.Generator().manual_seed(1))],
]


def tiny_gemma3_config(**overrides) -> transformers.Gemma3TextConfig:
    fields = dict(
        vocab_size=160, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=0.1, sliding_window=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], query_pre_attn_scalar=12,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        },
        bos_token_id=1, eos_token_id=2, pad_token_id=0, architectures=["Gemma3ForCausalLM"],
    )  # fmt: skip
    return transformers.Gemma3TextConfig(**{**fields, **overrides})


def save_gemma(config, directory) -> transformers.PreTrainedModel:
    """A random Gemma 3 folder whose norms are not all zeros (Gemma's ``1 + w`` then matters)."""
    hf_model = save_tiny(config, directory)
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.3)
    hf_model.save_pretrained(directory)
    return hf_model


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_gemma3_matches_transformers(softcap, tmp_path):
    hf_model = save_gemma(tiny_gemma3_config(final_logit_softcapping=softcap), tmp_path)
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=torch.device("cpu"))
    assert type(loaded.model).__name__ == "Gemma3ForCausalLM"
    assert loaded.max_model_len == 128  # not capped at the window: the local layers apply it
    windows = [layer.self_attn.sliding_window for layer in loaded.model.layers]
    assert windows == [5, None, 5]
    check_parity(hf_model, loaded, GEMMA_PROMPTS, block_size=4)
    check_parity(hf_model, loaded, [GEMMA_PROMPTS[2]], block_size=16)
    # the windows matter: attending to more than 5 positions gives other logits
    for layer in loaded.model.layers:
        layer.self_attn.sliding_window = layer.self_attn.sliding_window and 6
    with pytest.raises(AssertionError):
        check_parity(hf_model, loaded, [GEMMA_PROMPTS[2]], block_size=4)


def test_gemma3_bad_configs_are_named(tmp_path):
    from core.models import build_model

    with pytest.raises(ValueError, match="layer_types"):
        build_model(tiny_gemma3_config(layer_types=["sliding_attention", "chunked_attention", "full_attention"]), Kernels(),
                    torch.float32, torch.device("cpu"))  # fmt: skip
    with pytest.raises(ValueError, match="attn_logit_softcapping"):
        build_model(tiny_gemma3_config(attn_logit_softcapping=50.0), Kernels(), torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="Gemma 3 does not support tensor parallelism"):
        build_model(tiny_gemma3_config(), Kernels(), torch.float32, torch.device("cpu"), comm=object())
