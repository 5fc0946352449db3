"""Qwen3, Qwen3-MoE, Mixtral and Phi-3 against transformers, end to end on ``--device auto``.

Tiny random-weight checkpoints with the default model's vocabulary, prompted with text through
its tokenizer: Hugging Face folders, and GGUF files (llama.cpp's tensor names, Q8_0 linears and
stacked experts) for Qwen3, Qwen3-MoE and Mixtral, and a Mixtral file written by llama.cpp's own
``convert_hf_to_gguf.py`` (its tokenizer too). Greedy tokens must equal transformers', or
at the first difference each side's token must be in the other's top 5 (logprobs within 1e-3).
On the CPU plugins every step is one native call (the fused decoder: q/k head norms, routing and
experts in it), alone and under ``-tp 2``.
"""

from __future__ import annotations

import glob
import logging
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from core.bench.parity import hf_greedy
from plugins.runner import Runner

from core import LLM, SamplingParams

_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "mlp.gate": "ffn_gate_inp",
}  # fmt: skip
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def _round_trip(param: torch.nn.Parameter) -> np.ndarray:
    """Q8_0 bytes of ``param``, whose values become the dequantized ones."""
    data = gguf.quants.quantize(param.detach().float().numpy(), Q8_0)
    with torch.no_grad():
        param.copy_(torch.from_numpy(gguf.quants.dequantize(data, Q8_0)).reshape(param.shape))
    return data


def _permute(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for the llama architecture (its rope pairs neighbours)."""
    return rows.reshape(num_heads, 2, rows.shape[0] // num_heads // 2, -1).swapaxes(1, 2).reshape(rows.shape)


def write_gguf(model: torch.nn.Module, arch: str, path) -> None:
    """``model`` (a transformers causal LM with tied embeddings) as ``path``, architecture ``arch``."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(model.model.layers[0].self_attn.head_dim)
    writer.add_value_length(model.model.layers[0].self_attn.head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", 0)
    if num_experts:
        writer.add_expert_count(num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        if arch == "qwen3moe":
            writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tensor("token_embd.weight", model.model.embed_tokens.weight.detach().numpy())
    writer.add_tensor("output_norm.weight", model.model.norm.weight.detach().numpy())
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    for i, layer in enumerate(model.model.layers):
        for name, param in layer.named_parameters():
            module = name.removesuffix(".weight")
            if module in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
                data = _round_trip(param)
                if module.endswith("down_proj"):
                    writer.add_tensor(f"blk.{i}.ffn_down_exps.weight", data, raw_dtype=Q8_0)
                else:
                    gate, up = np.split(data, 2, axis=1)
                    writer.add_tensor(f"blk.{i}.ffn_gate_exps.weight", gate.copy(), raw_dtype=Q8_0)
                    writer.add_tensor(f"blk.{i}.ffn_up_exps.weight", up.copy(), raw_dtype=Q8_0)
                continue
            kind = _NAMES[module]
            if param.dim() == 1 or kind == "ffn_gate_inp":  # norms and the router stay float32
                writer.add_tensor(f"blk.{i}.{kind}.weight", param.detach().float().numpy())
                continue
            data = _round_trip(param)
            if arch == "llama" and kind in heads:
                data = _permute(data, heads[kind])
            writer.add_tensor(f"blk.{i}.{kind}.weight", data, raw_dtype=Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# -- the families: tiny configs (vocabulary set from the tokenizer) ---------------------------
SIZES = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=256, initializer_range=0.1, tie_word_embeddings=True)  # fmt: skip
MOE = dict(moe_intermediate_size=64, num_experts=8, num_experts_per_tok=2)  # 32 a rank under -tp 2
FAMILIES = {
    "qwen3": (transformers.Qwen3Config, dict(head_dim=16)),
    # layer 1 dense (mlp_only_layers), experts' weights not renormalized
    "qwen3_moe": (transformers.Qwen3MoeConfig, dict(head_dim=16, **MOE, mlp_only_layers=[1], norm_topk_prob=False)),
    "mixtral": (transformers.MixtralConfig, dict(num_local_experts=4, num_experts_per_tok=2)),
    "phi3": (transformers.Phi3Config, dict(original_max_position_embeddings=128, rope_scaling={
        "rope_type": "longrope", "short_factor": [1.0 + 0.2 * i for i in range(8)], "long_factor": [4.0] * 8})),
}  # fmt: skip
GGUF_ARCHS = {"qwen3": "qwen3", "qwen3_moe": "qwen3moe", "mixtral": "llama"}
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def tokenizer():
    from core.loader import default_model_path
    from core.loader.gguf_model import gguf_tokenizer

    return gguf_tokenizer(default_model_path(), None)  # converted once, then cached by the loader


def build(family, tokenizer, **overrides) -> transformers.PreTrainedModel:
    config_cls, extra = FAMILIES[family]
    ids = dict(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.eos_token_id)  # fmt: skip
    config = config_cls(**SIZES, **ids, **{**extra, **overrides})
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def check(llm, hf_model, **prompts) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = llm.generate(sampling_params=params, use_tqdm=False, **prompts)
    for out in outs:
        hf_tokens, hf_logprobs = hf_greedy(hf_model, out.prompt_token_ids, MAX_TOKENS)
        ours = out.outputs[0]
        assert len(ours.token_ids) == MAX_TOKENS
        for step, (a, b) in enumerate(zip(ours.token_ids, hf_tokens, strict=True)):
            assert abs(ours.logprobs[step][a].logprob - hf_logprobs[step][a].item()) < 1e-3, step
            if a != b:  # a near-tie may flip; both must be in the other's top 5
                assert b in ours.logprobs[step] and a in hf_logprobs[step].topk(5).indices.tolist(), (step, a, b)
                break


def save(hf_model, family, form, tmp_path):
    """``hf_model`` as a Hugging Face folder (``form`` ``"folder"``) or a GGUF file under ``tmp_path``: its path."""
    if form == "folder":
        hf_model.save_pretrained(tmp_path)
        return tmp_path
    path = tmp_path / f"{family}.gguf"
    write_gguf(hf_model, GGUF_ARCHS[family], path)
    return path


def fused_only(llm, monkeypatch) -> None:
    """On a platform whose runner has a fused native decoder (the CPU plugins), assert that it runs the
    model and make a step that falls back to the eager forward fail."""
    runner = llm.engine.executor.runner.runner
    if not hasattr(runner, "fused"):
        return
    assert runner.fused is not None, "the model should run as one native call a step"

    def eager(self, inputs):
        raise AssertionError("a step ran the eager forward")

    monkeypatch.setattr(Runner, "forward", eager)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hf_folder_matches_transformers(family, tokenizer, tmp_path, monkeypatch):
    hf_model = build(family, tokenizer)
    hf_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    llm = LLM(model=str(tmp_path), device="auto", dtype="float32", max_model_len=256, kv_cache_bytes=1 << 24)
    assert type(llm.engine.loaded.model).__name__ == type(hf_model).__name__
    fused_only(llm, monkeypatch)
    check(llm, hf_model, prompts=TEXTS)


@pytest.mark.parametrize("family", sorted(GGUF_ARCHS))
def test_gguf_matches_transformers(family, tokenizer, tmp_path, monkeypatch):
    # llama.cpp renormalizes qwen3moe's expert weights (Qwen3-MoE checkpoints' norm_topk_prob)
    hf_model = build(family, tokenizer, **({"norm_topk_prob": True} if family == "qwen3_moe" else {}))
    path = tmp_path / f"{family}.gguf"
    write_gguf(hf_model, GGUF_ARCHS[family], path)  # the model now holds the file's (dequantized) numbers
    llm = LLM(model=str(path), device="auto", dtype="float32", max_model_len=256, kv_cache_bytes=1 << 24,
              skip_tokenizer_init=True)  # fmt: skip
    assert type(llm.engine.loaded.model).__name__ == type(hf_model).__name__
    fused_only(llm, monkeypatch)
    check(llm, hf_model, prompt_token_ids=[tokenizer(text).input_ids for text in TEXTS])


def llamacpp_converter() -> Path | None:
    """llama.cpp's ``convert_hf_to_gguf.py`` in the bench cache (bench/llamacpp.py's build of llama.cpp,
    ``CORE_BENCH_CACHE`` or ``~/.cache/core-bench``), or None."""
    cache = Path(os.environ.get("CORE_BENCH_CACHE", Path.home() / ".cache" / "core-bench"))
    found = sorted(glob.glob(str(cache / "src" / "*" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py")))
    return Path(found[-1]) if found else None


def test_llamacpp_converted_mixtral_matches_transformers(tokenizer, tmp_path, monkeypatch):
    """A Mixtral folder through llama.cpp's converter (``--outtype q8_0``): the file as llama.cpp
    writes it (per-expert w1/w2/w3 stacked into ``ffn_{gate,up,down}_exps``, its q/k row order, the
    router kept float32, the vocabulary from the folder's tokenizer) loads, tokenizes the prompts
    itself and follows transformers on the same (Q8_0-rounded) weights."""
    convert = llamacpp_converter()
    if convert is None:
        pytest.skip("llama.cpp's convert_hf_to_gguf.py is not in the bench cache (python bench/moe.py fetches it)")
    hf_model = build("mixtral", tokenizer)
    for param in hf_model.parameters():
        if param.dim() >= 2:
            _round_trip(param)  # the converter's Q8_0 of these numbers gives them back
    folder, path = tmp_path / "folder", tmp_path / "mixtral.gguf"
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    done = subprocess.run([sys.executable, str(convert), str(folder), "--outtype", "q8_0", "--outfile", str(path)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    stacks = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors if "_exps" in t.name}
    assert stacks and set(stacks.values()) == {"Q8_0"}, stacks
    llm = LLM(model=str(path), device="auto", dtype="float32", max_model_len=256, kv_cache_bytes=1 << 24)
    assert type(llm.engine.loaded.model).__name__ == "MixtralForCausalLM"
    fused_only(llm, monkeypatch)
    assert [o.prompt_token_ids for o in llm.generate(TEXTS, SamplingParams(max_tokens=1), use_tqdm=False)] == [
        tokenizer(text).input_ids for text in TEXTS
    ]
    check(llm, hf_model, prompts=TEXTS)


@pytest.mark.slow  # two spawned workers a run
@pytest.mark.parametrize(("family", "form"), [("qwen3", "gguf"), ("qwen3_moe", "folder"), ("mixtral", "gguf")])
def test_tp2_fused_decoder_matches_transformers(family, form, tokenizer, tmp_path, capfd, caplog):
    """``--device auto -tp 2``: on the CPU plugins each rank runs its heads and its part of every expert
    as one native call a step (each rank's log says so: rank 0, the driver, in this process; rank 1 in
    its worker), the tokens follow transformers'."""
    caplog.set_level(logging.INFO, logger="plugins.cpu_native.runner")
    hf_model = build(family, tokenizer)
    path = save(hf_model, family, form, tmp_path)
    llm = LLM(model=str(path), device="auto", dtype="float32", max_model_len=256, kv_cache_bytes=1 << 24,
              skip_tokenizer_init=True, tensor_parallel_size=2)  # fmt: skip
    try:
        platform = llm.engine.platform.name
        check(llm, hf_model, prompt_token_ids=[tokenizer(text).input_ids for text in TEXTS])
    finally:
        llm.shutdown()
    if platform in ("cpu_x86", "cpu_arm", "s390x"):
        fused = f"{platform} runner: each step as one native"
        assert any(fused in record.getMessage() for record in caplog.records), "rank 0 (the driver) ran eagerly"
        assert f"(rank 1) INFO plugins.cpu_native.runner: {fused}" in capfd.readouterr().err


@pytest.mark.slow  # two spawned workers a run
@pytest.mark.parametrize(("family", "form"), [("qwen3_moe", "folder"), ("mixtral", "gguf"), ("phi3", "folder")])
def test_tp2_splits_experts_and_fused_projections(family, form, tokenizer, tmp_path):
    """Every expert split along its intermediate dimension over 2 ranks, Phi-3's stored qkv_proj and
    gate_up_proj split per part: the tokens of one rank, and transformers' (as ``check`` compares)."""
    from plugins.reference import ReferencePlatform

    hf_model = build(family, tokenizer)
    if form == "gguf":
        path = tmp_path / f"{family}.gguf"
        write_gguf(hf_model, GGUF_ARCHS[family], path)
    else:
        path = tmp_path
        hf_model.save_pretrained(path)
    prompts = [tokenizer(text).input_ids for text in TEXTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        llm = LLM(model=str(path), device=ReferencePlatform(), dtype="float32", max_model_len=256,
                  kv_cache_bytes=1 << 24, skip_tokenizer_init=True, tensor_parallel_size=tp)  # fmt: skip
        try:
            outs[tp] = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params,
                                                                      use_tqdm=False)]  # fmt: skip
            if tp == 2:
                check(llm, hf_model, prompt_token_ids=prompts)
        finally:
            llm.shutdown()
    assert outs[2] == outs[1]
