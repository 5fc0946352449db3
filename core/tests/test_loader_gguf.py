"""The default GGUF model (SmolLM2-135M-Instruct Q4_1) against transformers loading the same file.

The slow parts (transformers' GGUF load, our first load with the tokenizer conversion)
run once per module in fixtures; the tests then compare.
"""

from __future__ import annotations

import gguf
import pytest
import torch
import transformers
from core.loader import default_model_path, load_model
from core.loader.gguf_model import gguf_tokenizer
from core.models.standalone import StandaloneRunner
from plugins.errors import UnsupportedFeature
from plugins.kernels import GGUFWeight, Kernels

pytestmark = pytest.mark.slow
CPU = torch.device("cpu")
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
NUM_STEPS = 8


class DequantizingKernels(Kernels):
    """Takes GGUF weights as they are in the file and dequantizes them itself (checks the raw path)."""

    supported_quantizations = frozenset({"gguf"})

    def __init__(self) -> None:
        self.qtypes: list[str] = []

    def prepare_linear(self, weight, quantization):
        if isinstance(weight, GGUFWeight):
            assert quantization == "gguf"
            self.qtypes.append(weight.qtype)
            values = gguf.quants.dequantize(weight.data.numpy(), gguf.GGMLQuantizationType[weight.qtype])
            assert values.shape == (weight.rows, weight.cols)
            return torch.from_numpy(values)
        return super().prepare_linear(weight, quantization)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("core-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CORE_CACHE_DIR", str(path))
        yield path


@pytest.fixture(scope="module")
def ours(cache_dir):
    return load_model(None, kernels=Kernels(), dtype=torch.float32, device=CPU)


@pytest.fixture(scope="module")
def hf_model():
    path = default_model_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompt_ids(ours):
    return [ours.tokenizer(p).input_ids for p in PROMPTS]


def run_ours(loaded, prompt_ids):
    runner = StandaloneRunner(loaded.model, len(prompt_ids), max(map(len, prompt_ids)) + NUM_STEPS, block_size=16)
    return runner.greedy(prompt_ids, NUM_STEPS)


@pytest.fixture(scope="module")
def our_run(ours, prompt_ids):
    return run_ours(ours, prompt_ids)


def test_metadata(ours):
    assert ours.name == "SmolLM2-135M-Instruct"
    assert (ours.num_layers, ours.num_kv_heads, ours.head_size, ours.max_model_len) == (30, 3, 64, 8192)
    assert ours.eos_token_ids == [2]
    assert ours.hf_config.tie_word_embeddings
    # 134.5M parameters dequantized to fp32; the tied embedding counted once
    assert 500e6 < ours.weights_bytes < 560e6


def test_greedy_tokens_and_logits_match_transformers(ours, hf_model, prompt_ids, our_run):
    tokens, step_logits = our_run
    for i, prompt in enumerate(prompt_ids):
        with torch.no_grad():
            reference = hf_model(torch.tensor([prompt + tokens[i][:-1]])).logits[0, len(prompt) - 1 :]
        assert tokens[i] == reference.argmax(-1).tolist()
        torch.testing.assert_close(torch.stack([s[i] for s in step_logits]), reference, atol=2e-3, rtol=1e-4)
    assert "Paris" in ours.tokenizer.decode(tokens[0])


def test_gguf_weights_kept_quantized_give_the_same_logits(prompt_ids, our_run):
    kernels = DequantizingKernels()
    kept = load_model(None, kernels=kernels, dtype=torch.float32, device=CPU)
    # every block linear (q/k/v and gate/up fused: 4 per layer) and the tied output, as in the file
    assert sorted(kernels.qtypes) == ["Q4_1"] * 30 * 4 + ["Q8_0"]
    tokens, logits = run_ours(kept, prompt_ids)
    ref_tokens, ref_logits = our_run
    assert tokens == ref_tokens
    torch.testing.assert_close(torch.stack(logits), torch.stack(ref_logits), atol=1e-4, rtol=1e-4)


def test_tokenizer_cached_matches_transformers_conversion(ours, cache_dir):
    path = default_model_path()
    assert list((cache_dir / "tokenizers").iterdir()), "the converted tokenizer was not cached"
    assert list((cache_dir / "gguf").glob("*.json")), "the GGUF index was not cached"
    cached = gguf_tokenizer(path, None)  # a cache hit this time
    fresh = ours.tokenizer  # the first load converted it with AutoTokenizer.from_pretrained(gguf_file=...)
    assert cached is not fresh
    text = "Hello world! Ünïcödé, numbers 12345 and code: def f(x): return x**2\n\n<|im_end|>"
    ids = fresh(text).input_ids
    assert cached(text).input_ids == ids
    assert ids[:3] == [19556, 905, 17]  # "Hello", " world", "!"
    assert cached.decode(ids) == fresh.decode(ids) == text
    assert ours.tokenizer.chat_template and "<|im_start|>" in ours.tokenizer.chat_template
    chat = ours.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert chat.startswith("<|im_start|>system")


def test_gguf_quantization_on_reference_kernels_is_unsupported(cache_dir):
    with pytest.raises(UnsupportedFeature, match="gguf"):
        load_model(None, kernels=Kernels(), dtype=torch.float32, device=CPU, quantization="gguf")


@pytest.mark.parametrize("kv_cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16])
def test_kv_cache_dtype_keeps_greedy_parity(ours, hf_model, prompt_ids, kv_cache_dtype):
    """KV caches below float32 (one byte, 16-bit): the same greedy tokens as transformers,
    or at the first difference each side's token in the other's top 5 (a near-tie the
    cache's rounding may flip)."""
    runner = StandaloneRunner(
        ours.model, len(prompt_ids), max(map(len, prompt_ids)) + NUM_STEPS, block_size=16, kv_cache_dtype=kv_cache_dtype
    )
    tokens, step_logits = runner.greedy(prompt_ids, NUM_STEPS)
    for i, prompt in enumerate(prompt_ids):
        with torch.no_grad():
            reference = hf_model(torch.tensor([prompt + tokens[i][:-1]])).logits[0, len(prompt) - 1 :]
        for step, (a, b) in enumerate(zip(tokens[i], reference.argmax(-1).tolist(), strict=True)):
            if a != b:
                assert b in step_logits[step][i].topk(5).indices.tolist(), f"prompt {i} step {step}: {a} vs {b}"
                assert a in reference[step].topk(5).indices.tolist(), f"prompt {i} step {step}: {a} vs {b}"
                break
