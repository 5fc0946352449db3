"""The engine against Hugging Face transformers: same greedy tokens, close logprobs.

Tiny random-weight models of each supported architecture (no download), several
prompts of different lengths in one batch, with prefix caching on and off, chunked
prefill forced small, and a KV cache small enough to force preemption. After every
test the block manager must hold no leaked block.
"""

import pytest
import torch
import transformers
from core.bench.parity import hf_greedy
from plugins.reference import ReferencePlatform, tiny_model_config

from core import LLM, SamplingParams

ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "llama3_rope_tied": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        {
            "tie_word_embeddings": True,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        },
    ),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
    # every layer windowed (8 tokens, shorter than most prompts): blocks behind it are given back
    "mistral-window": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": 8}),
    # local layers with a window of 8 (shorter than most prompts) around a global one
    "gemma3": (
        transformers.Gemma3TextConfig,
        transformers.Gemma3ForCausalLM,
        {
            "head_dim": 16,
            "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16,
            "final_logit_softcapping": 30.0,
        },
    ),
}
PROMPTS = [
    [5, 17, 200, 3],
    list(range(10, 47)),
    [9],
    [int(x) for x in torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(3))],
]
MAX_TOKENS = 10


def build(arch, directory):
    config_cls, model_cls, extra = ARCHS[arch]
    torch.manual_seed(0)
    config = tiny_model_config(config_cls, **extra)
    model = model_cls(config).eval()
    model.save_pretrained(directory)
    return model


# distinct prompts that fill a small cache at admission and outgrow it while decoding
PREEMPT_PROMPTS = [
    [int(x) for x in torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(s))] for s in range(6)
]


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model_dir(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf = build(request.param, directory)
    return directory, {id(ps): [hf_greedy(hf, p, MAX_TOKENS) for p in ps] for ps in (PROMPTS, PREEMPT_PROMPTS)}


def engine(directory, device, **kwargs):
    """A float32 engine on the model in ``directory``: the reference platform, or ``device``."""
    device = ReferencePlatform() if device == "reference" else device
    return LLM(model=str(directory), device=device, dtype="float32", skip_tokenizer_init=True, **kwargs)


def assert_no_leak(llm):
    bm = llm.engine.block_manager
    assert not llm.engine.has_unfinished_requests()
    assert bm.num_free_blocks == bm.num_total_blocks, f"leaked {bm.num_total_blocks - bm.num_free_blocks} blocks"


def check_against_hf(llm, expected, prompts=PROMPTS):
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    expected = expected[id(prompts)]
    for out, (hf_tokens, hf_logprobs) in zip(outs, expected, strict=False):
        ours = out.outputs[0]
        for step, (a, b) in enumerate(zip(ours.token_ids, hf_tokens, strict=False)):
            ref = hf_logprobs[step]
            mine = ours.logprobs[step]
            assert abs(mine[a].logprob - ref[a].item()) < 1e-3, (
                f"step {step}: logprob {mine[a].logprob} vs {ref[a].item()}"
            )
            if a != b:  # a near-tie may flip; both must be in the other's top 5
                assert b in mine and a in ref.topk(5).indices.tolist(), f"step {step}: {a} vs {b}"
                break  # the continuations differ from here on
    assert_no_leak(llm)


@pytest.mark.parametrize(
    "engine_kwargs",
    [
        {},
        {"enable_prefix_caching": False},
        {"max_num_batched_tokens": 16, "max_num_seqs": 4},  # chunked prefill of every long prompt
    ],
    ids=["default", "no_prefix_cache", "chunked_prefill"],
)
@pytest.mark.parametrize("device", ["reference", "auto"])
def test_greedy_matches_transformers(model_dir, engine_kwargs, device):
    """The reference platform, and the one `--device auto` picks (its native kernels and runner)."""
    directory, expected = model_dir
    llm = engine(directory, device, max_model_len=128, **engine_kwargs)
    check_against_hf(llm, expected)
    # same prompts again: now served from the prefix cache where enabled, same tokens
    check_against_hf(llm, expected)
    if engine_kwargs.get("enable_prefix_caching", True):
        assert llm.engine.block_manager.prefix_cache_hits > 0


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("device", ["reference", "auto"])
def test_greedy_matches_transformers_under_preemption(model_dir, prefix_caching, device):
    """24 blocks of 4 tokens: three 30-token prompts fill them, their decodes outgrow them (a
    model windowed in every layer gives back the blocks behind its window and never preempts)."""
    directory, expected = model_dir
    block_bytes = 2 * 2 * 4 * 2 * 16 * 4  # K+V, layers, block size, kv heads, head size, fp32
    llm = engine(
        directory,
        device,
        max_model_len=96,
        block_size=4,
        kv_cache_bytes=24 * block_bytes,
        enable_prefix_caching=prefix_caching,
    )
    assert llm.engine.block_manager.num_total_blocks == 24
    check_against_hf(llm, expected, PREEMPT_PROMPTS)
    if directory.name.startswith("mistral-window"):
        assert llm.engine.scheduler.num_preemptions == 0, "blocks behind the 8-token window were not given back"
    else:
        assert llm.engine.scheduler.num_preemptions > 0, "the small cache was meant to force preemption"


@pytest.mark.parametrize("device", ["reference", "auto"])
def test_profile_run_only_when_the_profiler_needs_it(tmp_path, device, monkeypatch):
    """The engine runs the profile forward pass exactly when the platform's memory profiler
    asks for it (the reference's does; cpu_x86's sizes the KV cache without one), and
    generates the same tokens either way."""
    from core.model_runner import ModelRunner

    hf = build("llama", tmp_path)
    calls = []
    profile_run = ModelRunner.profile_run
    monkeypatch.setattr(ModelRunner, "profile_run", lambda self: calls.append(self) or profile_run(self))
    llm = engine(tmp_path, device, max_model_len=128, kv_cache_bytes=1 << 20)
    needs = llm.engine.platform.memory.needs_profile_run
    assert len(calls) == int(needs) and (needs or device != "reference")
    check_against_hf(llm, {id(PROMPTS): [hf_greedy(hf, p, MAX_TOKENS) for p in PROMPTS]})


@pytest.mark.parametrize("kv_cache_dtype", ["fp8", "fp8_e5m2", "bfloat16", "float16"])
@pytest.mark.parametrize("device", ["reference", "auto"])
def test_kv_cache_dtype_greedy_parity(model_dir, device, kv_cache_dtype):
    """KV caches rounded below the float32 compute (E4M3 with per-layer scales, E5M2,
    bfloat16, float16): equal tokens, or at the first difference each side's token in the other's top
    5; twice, the second time from the prefix cache.
    Llama and Gemma 3 (sliding windows, q/k norms) only, to stay fast: Qwen2 and Mistral
    share Llama's attention."""
    directory, expected = model_dir
    if not directory.name.startswith(("llama", "gemma3")):
        pytest.skip("KV cache dtype parity runs on llama and gemma3 (the same attention as qwen2 and mistral)")
    llm = engine(directory, device, max_model_len=128, kv_cache_dtype=kv_cache_dtype)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    for _ in range(2):
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=params, use_tqdm=False)
        for out, (hf_tokens, hf_logprobs) in zip(outs, expected[id(PROMPTS)], strict=True):
            ours = out.outputs[0]
            for step, (a, b) in enumerate(zip(ours.token_ids, hf_tokens, strict=True)):
                if a != b:
                    assert b in ours.logprobs[step] and a in hf_logprobs[step].topk(5).indices.tolist(), (step, a, b)
                    break
    assert_no_leak(llm)
