"""Quantized Hugging Face checkpoints: our greedy decoding vs transformers on the same checkpoint.

Tiny random Llama and Qwen2 models are quantized in the test (round to nearest, by the
``compressed-tensors`` package; FP8 static input scales calibrated on random tokens) and saved
as llm-compressor saves them. transformers loads them with
``CompressedTensorsConfig(run_compressed=False)`` (decompressed weights; W8A8's activations
fake-quantized, per token or with the stored input scale, by compressed-tensors' own code,
hooked back in: transformers 5 runs plain float ``Linear`` layers there): the reference. We
load them kept as stored,
with the SDK's reference kernels and with cpu_x86's native ones. Parity: equal greedy
tokens, or at the first difference each side's token in the other's top 5.

The legacy AutoGPTQ (with act-order ``g_idx``) and AutoAWQ layouts are checked against
transformers on the same weights in compressed-tensors form, and, where GPTQModel (and
optimum, for GPTQ) are installed, against transformers reading the legacy layouts: a source
package with no wheels, not in the test requirements.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from core.bench.parity import greedy_parity, hf_next_logits
from core.loader import load_model
from core.models.standalone import StandaloneRunner
from plugins.errors import UnsupportedFeature
from plugins.int_quant import FP8, from_compressed
from plugins.kernels import Kernels
from plugins.reference import tiny_model_config
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

pytest.importorskip("compressed_tensors")
from plugins.testing.quant import (  # noqa: E402
    fp8_scheme,
    load_decompressed,
    quantize_rtn,
    save_compressed,
    save_word_tokenizer,
    scheme,
    to_awq,
    to_gptq,
)

#: name -> (bits, symmetric, group size or None, int8 activations)
SCHEMES = {
    "w8a8": (8, True, None, True),
    "w4a16": (4, True, 32, False),
    "w4a16-asym": (4, False, 32, False),
    "w8a16": (8, True, None, False),
    "w4a16-asym-channel": (4, False, None, False),
}
#: name -> (weight scale per channel, else per tensor; activations): llm-compressor's FP8_DYNAMIC, FP8
FP8_SCHEMES = {"fp8-dynamic": (True, "fp8_per_token"), "fp8-static": (False, "fp8_static")}
CALIBRATION = torch.arange(64).reshape(2, 32) * 37 % 256  # token ids for static input scales
ARCHS = {"llama": LlamaConfig, "qwen2": Qwen2Config}
PROMPTS = [[5, 17, 33, 9, 100, 41, 7], [3, 150, 22], [90, 12, 61, 22, 8, 77, 31, 45, 120, 11, 64, 5, 19]]
NUM_STEPS = 6


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``(arch, scheme) -> directory`` of compressed-tensors checkpoints, built on first use."""
    made: dict[tuple[str, str], Path] = {}

    def get(arch: str, name: str) -> Path:
        if (arch, name) not in made:
            directory = tmp_path_factory.mktemp(f"{arch}-{name}")
            config = tiny_model_config(ARCHS[arch], initializer_range=0.1, tie_word_embeddings=arch == "qwen2")
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            quant = scheme(*SCHEMES[name]) if name in SCHEMES else fp8_scheme(*FP8_SCHEMES[name])
            quantize_rtn(model, quant, calibration=CALIBRATION)
            save_compressed(model, directory)
            save_word_tokenizer(directory, config.vocab_size)
            made[(arch, name)] = directory
        return made[(arch, name)]

    return get


def native_kernels():
    from plugin_cpu_x86.platform import CpuX86Platform

    return CpuX86Platform().kernels


KERNELS = {"reference": Kernels, "cpu_x86": native_kernels}


def assert_greedy_parity(hf_model, loaded) -> None:
    """The parity rule on :data:`PROMPTS`, all in one batch, :data:`NUM_STEPS` tokens each."""
    greedy_parity(loaded.model, hf_next_logits(hf_model), PROMPTS, NUM_STEPS, block_size=4)


#: every scheme on the native kernels; the SDK reference (slower, dequantizing per call) on two
CASES = [("llama", n, "cpu_x86") for n in SCHEMES] + [("qwen2", n, "cpu_x86") for n in ("w8a8", "w4a16", "w4a16-asym")]
CASES += [("llama", "w8a8", "reference"), ("qwen2", "w4a16-asym", "reference")]


@pytest.mark.parametrize("arch,name,kernels", CASES)
def test_compressed_tensors_parity(checkpoints, arch, name, kernels):
    directory = checkpoints(arch, name)
    loaded = load_model(str(directory), kernels=KERNELS[kernels](), dtype=torch.float32, device=torch.device("cpu"))
    qkv = loaded.model.layers[0].self_attn.qkv_proj.weight
    assert type(qkv).__name__ in ("IntWeight", "QuantizedWeight")  # kept as stored, never dequantized at load
    if kernels == "cpu_x86":
        assert type(qkv).__name__ == "QuantizedWeight" and qkv.per_token == SCHEMES[name][3]
    assert_greedy_parity(load_decompressed(directory), loaded)


FP8_CASES = [("llama", n, k) for n in FP8_SCHEMES for k in KERNELS] + [("qwen2", "fp8-static", "cpu_x86")]


@pytest.mark.parametrize("arch,name,kernels", FP8_CASES)
def test_fp8_parity(checkpoints, arch, name, kernels):
    """FP8 linears kept as stored: E4M3 bytes on cpu_x86's native kernel (activations rounded to
    FP8 before it), the codes as they came on the SDK reference."""
    directory = checkpoints(arch, name)
    loaded = load_model(str(directory), kernels=KERNELS[kernels](), dtype=torch.float32, device=torch.device("cpu"))
    qkv = loaded.model.layers[0].self_attn.qkv_proj.weight
    if kernels == "cpu_x86":
        assert type(qkv).__name__ == "QuantizedWeight" and qkv.fmt == "fp8_e4m3" and qkv.data.dtype == torch.uint8
        activations = qkv.fp8_activations
    else:
        assert type(qkv).__name__ == "IntWeight" and qkv.codes.dtype == FP8
        activations = qkv.activations
    assert activations == FP8_SCHEMES[name][1] and (qkv.input_scale is not None) == (name == "fp8-static")
    hf = load_decompressed(directory)
    assert loaded.weights_bytes < sum(p.numel() for p in hf.parameters()) * 4 / 2
    assert_greedy_parity(hf, loaded)
    # the same float32 computation: the prompts' logits agree far closer than the rule asks
    # (float activations instead of E4M3 ones would be ~0.1 off here)
    _, [logits] = StandaloneRunner(loaded.model, len(PROMPTS), 32, block_size=4).greedy(PROMPTS, 1)
    for prompt, ours in zip(PROMPTS, logits, strict=True):
        torch.testing.assert_close(ours, hf_next_logits(hf)(prompt), rtol=0, atol=1e-4)


def legacy_copy(source: Path, target: Path, layout: str) -> Path:
    """``source``'s W4A16 asymmetric group-32 weights rewritten in the AutoGPTQ (act-order) or AutoAWQ layout."""
    target.mkdir()
    for item in source.iterdir():
        if item.name not in ("model.safetensors", "config.json"):
            (target / item.name).write_bytes(item.read_bytes())
    tensors = load_file(source / "model.safetensors")
    prefixes = sorted({name.rsplit(".", 1)[0] for name in tensors if name.endswith(".weight_packed")})
    for prefix in prefixes:
        parts = {k.rsplit(".", 1)[1]: tensors.pop(k) for k in [n for n in tensors if n.startswith(prefix + ".")]}
        weight = from_compressed(parts, 4, 32, True, None)
        groups = weight.cols // 32
        legacy = to_awq(weight) if layout == "awq" else to_gptq(weight, torch.arange(groups).roll(1))
        tensors.update({f"{prefix}.{k}": v for k, v in legacy.items()})
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = (
        {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
        if layout == "awq"
        else {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False}
    )
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("kernels", list(KERNELS))
@pytest.mark.parametrize("layout", ["gptq", "awq"])
def test_legacy_layouts_parity(checkpoints, tmp_path, kernels, layout):
    source = checkpoints("llama", "w4a16-asym")
    legacy_copy(source, tmp_path / layout, layout)
    loaded = load_model(str(tmp_path / layout), kernels=KERNELS[kernels](), dtype=torch.float32, device="cpu")
    qkv = loaded.model.layers[0].self_attn.qkv_proj.weight
    assert (qkv.perm is not None) == (layout == "gptq")  # act-order: the input gathered first
    assert_greedy_parity(load_decompressed(source), loaded)


@pytest.mark.parametrize("layout", ["gptq", "awq"])
def test_legacy_layouts_against_transformers_reading_them(checkpoints, tmp_path, layout):
    """Where GPTQModel is installed (a source package: ~9 minutes to build here, not in CI),
    transformers reads the legacy layouts itself on the CPU: the same parity rule against it."""
    pytest.importorskip("gptqmodel")
    if layout == "gptq":
        pytest.importorskip("optimum")
    directory = legacy_copy(checkpoints("llama", "w4a16-asym"), tmp_path / layout, layout)
    hf = AutoModelForCausalLM.from_pretrained(directory, device_map="cpu", dtype=torch.float32).eval()
    assert "gptqmodel" in type(hf.model.layers[0].self_attn.q_proj).__module__
    for kernels in KERNELS.values():
        assert_greedy_parity(hf, load_model(str(directory), kernels=kernels(), dtype=torch.float32, device="cpu"))


def with_quantization_config(source: Path, target: Path, change) -> Path:
    target.mkdir()
    for item in source.iterdir():
        (target / item.name).write_bytes(item.read_bytes())
    config = json.loads((source / "config.json").read_text())
    change(config["quantization_config"])
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda q: q.update(quant_method="bitsandbytes"), "'bitsandbytes' is not supported"),
        (lambda q: q.update(format="float-quantized") or q["config_groups"]["group_0"].update(format=None),
         "'float-quantized' with int weights is not supported"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=2), "'num_bits': 2"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block"), "strategy 'block'"),
        (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float"}), "kv_cache_scheme"),
    ],
)  # fmt: skip
def test_unsupported_schemes_are_named(checkpoints, tmp_path, change, message):
    directory = with_quantization_config(checkpoints("llama", "w4a16"), tmp_path / "bad", change)
    with pytest.raises(UnsupportedFeature, match=message):
        load_model(str(directory), kernels=Kernels(), dtype=torch.float32, device="cpu")


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block", block_structure=[128, 128]),
         "FP8 block-wise weight scales"),
        (lambda q: q.update(kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor"}), "kv_cache_scheme"),
    ],
)  # fmt: skip
def test_unsupported_fp8_variants_are_named(checkpoints, tmp_path, change, message):
    directory = with_quantization_config(checkpoints("llama", "fp8-static"), tmp_path / "bad", change)
    with pytest.raises(UnsupportedFeature, match=message):
        load_model(str(directory), kernels=Kernels(), dtype=torch.float32, device="cpu")


def test_quantization_flag_must_match_the_checkpoint(checkpoints):
    directory = str(checkpoints("llama", "w4a16"))
    for wrong in ("gptq", "int8"):
        with pytest.raises(ValueError, match=f"'{wrong}' requested, but the checkpoint is quantized with"):
            load_model(directory, kernels=Kernels(), dtype=torch.float32, device="cpu", quantization=wrong)
    loaded = load_model(directory, kernels=native_kernels(), dtype=torch.float32, device="cpu",
                        quantization="compressed-tensors")  # fmt: skip
    dense = sum(p.numel() for p in load_decompressed(checkpoints("llama", "w4a16")).parameters()) * 4
    assert loaded.weights_bytes < dense  # 4-bit blocks: the linears take about a sixth of float32's bytes


@pytest.mark.parametrize("layout", ["w8a8", "gptq", "fp8-dynamic", "fp8-static"])
def test_engine_on_cpu_x86(checkpoints, tmp_path, layout):
    """The whole engine on cpu_x86: W8A8 through its fused native decoder (per-token activations
    passed down), act-order GPTQ eagerly (the decoder does not gather inputs), FP8 eagerly (the
    activations' FP8 rounding runs before each native linear)."""
    from core import LLM, SamplingParams

    source = checkpoints("llama", "w4a16-asym" if layout == "gptq" else layout)
    directory = legacy_copy(source, tmp_path / layout, layout) if layout == "gptq" else source
    llm = LLM(model=str(directory), device="cpu_x86", dtype="float32", skip_tokenizer_init=True, max_model_len=64)
    assert (llm.engine.platform.runner.fused is not None) == (layout == "w8a8")
    params = SamplingParams(temperature=0.0, max_tokens=NUM_STEPS, ignore_eos=True, logprobs=5)
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
    reference = hf_next_logits(load_decompressed(source))
    for out, prompt in zip(outs, PROMPTS, strict=True):
        ours, sequence = out.outputs[0], list(prompt)
        for step, mine in enumerate(ours.token_ids):
            logits = reference(sequence)
            theirs = int(logits.argmax())
            if theirs != mine:  # the parity rule, our top 5 from the engine's logprobs
                assert theirs in ours.logprobs[step] and mine in logits.topk(5).indices.tolist(), f"step {step}"
                break
            sequence.append(theirs)
