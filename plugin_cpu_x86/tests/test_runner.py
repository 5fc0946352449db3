"""The fused native decoder (plugins.cpu_native.runner, on cpu_x86) against the eager forward of the same model.

Both run the same kernels in the same order, so hidden states and KV caches must be
identical, not just close: prefill chunks, mixed batches and decode steps, for Llama,
Qwen2 (q/k/v biases) and Qwen3 (q/k head norms), float32 and bfloat16, dense, int8 and
int8-activation weights. Mixture-of-experts layers (Qwen3-MoE, Mixtral) route in the native
decoder with its own float32 softmax: their hidden states are within rounding of the eager ones.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import transformers
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.attention import AttentionMetadata
from plugins.cpu_native.runner import FusedDecoder, NativeCpuRunner, NotFusable
from plugins.kv_cache import new_kv_scale
from plugins.reference import tiny_model_config
from plugins.runner import ModelInputs

core_loader = pytest.importorskip("core.loader.loader", reason="the fused decoder runs core's models")

ARCHS = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
         "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
         "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16})}  # fmt: skip
#: layer 0 of the Qwen3-MoE model is sparse, layer 1 dense; its expert weights are not renormalized
MOE_ARCHS = {
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, {
        "head_dim": 16, "moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2,
        "mlp_only_layers": [1], "norm_topk_prob": False}),
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
}  # fmt: skip
BLOCK = 4


def save_tiny(archs, name, tmp_path_factory):
    config_cls, model_cls, extra = archs[name]
    torch.manual_seed(0)
    config = tiny_model_config(config_cls, vocab_size=128, **extra)
    path = tmp_path_factory.mktemp(name)
    model_cls(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model_dir(request, tmp_path_factory):
    return save_tiny(ARCHS, request.param, tmp_path_factory)


@pytest.fixture(scope="module", params=sorted(MOE_ARCHS))
def moe_dir(request, tmp_path_factory):
    return save_tiny(MOE_ARCHS, request.param, tmp_path_factory)


def load(path, dtype, quantization, int8_act):
    platform = CpuX86Platform()
    kernels = platform.kernels
    kernels.quantize_activations = int8_act
    loaded = core_loader.load_model(
        str(path), kernels=kernels, dtype=dtype, device=torch.device("cpu"), quantization=quantization,
        skip_tokenizer_init=True,
    )  # fmt: skip
    return platform, loaded.model


def caches(model, num_blocks):
    shape = (num_blocks, BLOCK, model.num_kv_heads, model.head_size)
    return [(torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype)) for _ in model.layers]


def step_inputs(new_tokens, seq_lens, tables):
    """Inputs for sequences that already hold ``seq_lens`` tokens and get ``new_tokens``."""
    positions = [p for toks, n in zip(new_tokens, seq_lens, strict=True) for p in range(n, n + len(toks))]
    totals = [n + len(toks) for toks, n in zip(new_tokens, seq_lens, strict=True)]
    meta = AttentionMetadata.build([len(t) for t in new_tokens], totals, tables, BLOCK, torch.device("cpu"))
    ids = torch.tensor([t for toks in new_tokens for t in toks], dtype=torch.int64)
    return ModelInputs(ids, torch.tensor(positions, dtype=torch.int64), meta), totals


DTYPES_QUANTIZATIONS = [
    (torch.float32, None, False), (torch.float32, "int8", False), (torch.float32, "int8", True),
    (torch.bfloat16, "int8", False), (torch.bfloat16, None, False),
]  # fmt: skip


def run_steps(model, fused, eager_caches, fused_caches, same):
    """Prompts, decode steps mixed with a prompt chunk, decode steps: ``same(fused, eager, what)`` on
    each step's hidden states and the caches after it."""
    gen = torch.Generator().manual_seed(0)
    tables = [[3, 0, 7, 9], [1, 2, 4, 5], [11, 8, 6, 10]]  # out of order: a wrong table shows
    steps = [
        [[5, 9, 2], [7], [1, 2, 3, 4, 5, 6]],  # prompts
        [[4], [8, 8, 3, 1, 2], [6]],  # decode steps mixed with a prompt chunk
    ] + [[[int(t)] for t in torch.randint(0, 128, (3,), generator=gen)] for _ in range(5)]
    seq_lens = [0, 0, 0]
    with torch.inference_mode():
        for i, new_tokens in enumerate(steps):
            inputs, seq_lens = step_inputs(new_tokens, seq_lens, tables)
            expected = model(inputs.input_ids, inputs.positions, eager_caches, inputs.attn_metadata)
            assert fused.can_run(inputs)
            same(fused(inputs), expected, f"step {i} hidden states")
            for (ek, ev), (fk, fv) in zip(eager_caches, fused_caches, strict=True):
                same(fk, ek, f"step {i} K cache")
                same(fv, ev, f"step {i} V cache")


def identical(actual, expected, what):
    assert torch.equal(actual, expected), f"{what} differ by {(actual - expected).abs().max()}"


@pytest.mark.parametrize("dtype,quantization,int8_act", DTYPES_QUANTIZATIONS)
def test_fused_equals_eager(model_dir, dtype, quantization, int8_act):
    platform, model = load(model_dir, dtype, quantization, int8_act)
    eager_caches, fused_caches = caches(model, 24), caches(model, 24)
    if dtype == torch.bfloat16 and quantization is None:  # bf16 dense weights go through torch's GEMM
        with pytest.raises(NotFusable, match="not a contiguous torch.float32"):
            FusedDecoder(model.describe(fused_caches), platform.kernels)
        return
    fused = FusedDecoder(model.describe(fused_caches), platform.kernels)
    run_steps(model, fused, eager_caches, fused_caches, identical)


@pytest.mark.parametrize("dtype,quantization,int8_act", DTYPES_QUANTIZATIONS)
def test_fused_moe_layers_follow_eager(moe_dir, dtype, quantization, int8_act):
    """The router, its softmax and top-k (renormalized or not) and the experts in the native decoder: the
    eager forward's hidden states and caches within rounding. The softmaxes differ in the last bit, which
    can flip a later rounding of the activations: to bfloat16, or with int8 activations (llama.cpp's) to
    the next of a block's 255 levels."""
    platform, model = load(moe_dir, dtype, quantization, int8_act)
    eager_caches, fused_caches = caches(model, 24), caches(model, 24)
    if dtype == torch.bfloat16 and quantization is None:
        # with the bf16 kernels (AVX512_BF16) the experts pack and a dense bf16 weight is refused;
        # without them (CORE_CPU_KERNEL_ISA=avx2) the bf16 experts are left unpacked and named
        packed = platform.kernels.lib.linear_bf16w_ready()
        refusal = "not a contiguous torch.float32" if packed else "experts are not packed for the native kernel"
        with pytest.raises(NotFusable, match=refusal):
            FusedDecoder(model.describe(fused_caches), platform.kernels)
        return
    fused = FusedDecoder(model.describe(fused_caches), platform.kernels)
    tolerance = 2e-2 if dtype == torch.bfloat16 or int8_act else 1e-4

    def close(actual, expected, what):
        torch.testing.assert_close(actual.float(), expected.float(), atol=tolerance, rtol=tolerance,
                                   msg=lambda m: f"{what}: {m}")  # fmt: skip

    run_steps(model, fused, eager_caches, fused_caches, close)


def test_unpacked_experts_run_eagerly(moe_dir, monkeypatch):
    """bfloat16 experts as stored (CPU_MOE_PREPACK=0) have no native kernel: the decoder declines, naming the layer."""
    monkeypatch.setenv("CORE_CPU_MOE_PREPACK", "0")
    platform, model = load(moe_dir, torch.bfloat16, None, False)
    with pytest.raises(NotFusable, match="layer 0 experts are not packed"):
        FusedDecoder(model.describe(caches(model, 4)), platform.kernels)


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16, torch.float16])
def test_fused_equals_eager_with_cast_cache(model_dir, cache_dtype):
    """Caches of another dtype (one-byte, 16-bit under float32): an E4M3 cache's first step
    runs eagerly (it sets the layers' scales), then the fused decoder takes over; hidden
    states and cache bytes equal the eager run's."""
    platform, model = load(model_dir, torch.float32, None, False)
    shape = (24, BLOCK, model.num_kv_heads, model.head_size)
    scaled = cache_dtype == torch.float8_e4m3fn

    def cast_caches():
        return [
            (torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype),
             *((new_kv_scale("cpu"),) if scaled else ()))
            for _ in model.layers
        ]  # fmt: skip

    eager_caches, fused_caches = cast_caches(), cast_caches()
    fused = FusedDecoder(model.describe(fused_caches), platform.kernels)
    tables = [[3, 0, 7, 9], [1, 2, 4, 5]]
    steps = [[[5, 9, 2], [1, 2, 3, 4, 5, 6]], [[4], [8, 8, 3]], [[7], [6]], [[1], [2]]]
    seq_lens = [0, 0]
    with torch.inference_mode():
        for i, new_tokens in enumerate(steps):
            inputs, seq_lens = step_inputs(new_tokens, seq_lens, tables)
            expected = model(inputs.input_ids, inputs.positions, eager_caches, inputs.attn_metadata)
            assert fused.can_run(inputs) == (i > 0 or not scaled)
            if fused.can_run(inputs):
                actual = fused(inputs)
            else:
                actual = model(inputs.input_ids, inputs.positions, fused_caches, inputs.attn_metadata)
            assert torch.equal(actual, expected), f"step {i}: hidden states differ by {(actual - expected).abs().max()}"
    for eager, fused_layer in zip(eager_caches, fused_caches, strict=True):
        for a, b in zip(eager, fused_layer, strict=True):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_runner_uses_fused_only_where_it_applies(model_dir, monkeypatch):
    platform, model = load(model_dir, torch.float32, None, False)
    kv = caches(model, 8)
    runner = NativeCpuRunner(platform)
    runner.prepare(model, kv, None)
    big, _ = step_inputs([list(range(20))], [0], [[4, 5, 6, 7, 0, 1]])
    assert runner.fused is not None and runner.fused.can_run(big)
    assert not runner.fused.can_run(replace(big, input_ids=big.input_ids.int()))  # ids it does not take: eager
    with torch.inference_mode():
        eager = model(big.input_ids, big.positions, caches(model, 8), big.attn_metadata)
        assert torch.equal(runner.execute(big), eager)  # on the bound caches
    monkeypatch.setenv("CORE_CPU_FUSED_DECODE", "0")
    platform = CpuX86Platform()
    runner = NativeCpuRunner(platform)
    runner.prepare(model, kv, None)
    assert runner.fused is None


def test_bad_token_and_slot_are_errors(model_dir):
    platform, model = load(model_dir, torch.float32, "int8", False)
    kv = caches(model, 2)
    fused = FusedDecoder(model.describe(kv), platform.kernels)
    inputs, _ = step_inputs([[1, 500]], [0], [[0, 1]])
    with pytest.raises(IndexError, match="vocabulary of 128"):
        fused(inputs)
    inputs, _ = step_inputs([[1, 2]], [0], [[0, 1]])
    inputs.attn_metadata.slot_mapping[1] = 8  # the caches hold 2 blocks x 4 slots
    with pytest.raises(IndexError, match="8 slots"):
        fused(inputs)


def test_models_without_a_description_run_eagerly(model_dir, caplog):
    platform, model = load(model_dir, torch.float32, None, False)

    class Opaque(torch.nn.Module):  # a model the runner knows nothing about: no describe()
        def forward(self, *args):
            return model(*args)

    kv = caches(model, 8)
    runner = NativeCpuRunner(platform)
    with caplog.at_level("INFO"):
        runner.prepare(Opaque(), kv, None)
    assert runner.fused is None and "Opaque does not describe itself" in caplog.text
    big, _ = step_inputs([list(range(20))], [0], [[4, 5, 6, 7, 0, 1]])
    with torch.inference_mode():
        eager = model(big.input_ids, big.positions, caches(model, 8), big.attn_metadata)
        assert torch.equal(runner.execute(big), eager)
