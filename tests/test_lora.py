"""LoRA adapters against transformers + peft: the same greedy tokens, alone and in mixed batches.

Adapters are made with peft on a tiny random Llama (random A and B, so every adapted module
changes the answer): one of rank 8 on all seven projections saved as safetensors, one of
rank 4 with rsLoRA on q/v saved as ``adapter_model.bin``. The default model's GGUF (kept
quantized) gets one too. What we cannot apply is refused by name.
"""

import json
import shutil

import pytest
import torch
import transformers
from core.bench.parity import hf_greedy
from core.lora.manager import LoRAManager
from peft import LoraConfig, get_peft_model
from plugins.reference import ReferencePlatform, tiny_model_config

from core import LLM, LoRARequest, SamplingParams

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ADAPTERS = {  # name: (LoraConfig options, save as safetensors)
    "all8": ({"r": 8, "lora_alpha": 16, "target_modules": ALL_MODULES}, True),
    "qv4": ({"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "use_rslora": True}, False),
}
PROMPTS = [[5, 17, 200, 3], list(range(10, 47)), [9]]
MAX_TOKENS = 10
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=1)


def make_adapter(hf, directory, options, safetensors, seed):
    torch.manual_seed(seed)
    peft_model = get_peft_model(hf, LoraConfig(init_lora_weights=False, **options)).eval()
    peft_model.save_pretrained(directory, safe_serialization=safetensors)
    return peft_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The model's directory, each adapter's LoRARequest, and transformers' (+ peft's) greedy tokens
    of every prompt under None (the base model) and each adapter."""
    root = tmp_path_factory.mktemp("lora")
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(tiny_model_config()).eval()
    hf.save_pretrained(root / "model")
    expected = {None: [hf_greedy(hf, p, MAX_TOKENS)[0] for p in PROMPTS]}
    requests = {}
    for i, (name, (options, safetensors)) in enumerate(ADAPTERS.items()):
        peft_model = make_adapter(hf, root / name, options, safetensors, seed=i + 1)
        expected[name] = [hf_greedy(peft_model, p, MAX_TOKENS)[0] for p in PROMPTS]
        hf = peft_model.unload()
        requests[name] = LoRARequest(name, i + 1, str(root / name))
    assert (root / "qv4" / "adapter_model.bin").is_file()
    return root, requests, expected


def engine(root, device="reference", **kwargs):
    device = ReferencePlatform() if device == "reference" else device
    options = {"enable_lora": True, "max_lora_rank": 8, "max_loras": 2, **kwargs}
    return LLM(model=str(root / "model"), device=device, dtype="float32", skip_tokenizer_init=True, **options)


def assert_no_leak(llm):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "KV blocks leaked"


@pytest.mark.parametrize("device", ["reference", "auto"])
def test_mixed_batch_matches_peft(tiny, device):
    """Every prompt under the base model and both adapters, all in one batch: each its own answer."""
    root, requests, expected = tiny
    llm = engine(root, device, max_loras=3)
    names = [None, *requests]
    prompts = [p for _ in names for p in PROMPTS]
    loras = [requests.get(n) for n in names for _ in PROMPTS]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY, lora_request=loras, use_tqdm=False)
    got = [o.outputs[0].token_ids for o in outs]
    want = [t for n in names for t in expected[n]]
    assert got == want
    assert expected["all8"] != expected[None] != expected["qv4"], "the adapters must change the answers"
    assert_no_leak(llm)


@pytest.mark.slow  # two spawned workers import torch and transformers
@pytest.mark.parametrize("device", ["reference", "auto"])
def test_tensor_parallel_mixed_batch_matches_peft(tiny, device):
    """TP=2: each rank holds its part of every adapter (B's rows of q/k/v and gate/up, A's columns of
    o and down); base and both adapters in one batch each get peft's answer."""
    root, requests, expected = tiny
    llm = engine(root, device, max_loras=3, tensor_parallel_size=2, distributed_executor_backend="mp",
                 max_model_len=128, kv_cache_bytes=1 << 22)  # fmt: skip
    try:
        names = [None, *requests]
        loras = [requests.get(n) for n in names for _ in PROMPTS]
        outs = llm.generate(prompt_token_ids=[p for _ in names for p in PROMPTS], sampling_params=GREEDY,
                            lora_request=loras, use_tqdm=False)  # fmt: skip
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in outs] == [t for n in names for t in expected[n]]


def test_max_loras_bounds_each_step(tiny, monkeypatch):
    """With max_loras=1, two adapters and the base model in flight: one adapter a step, all answers right."""
    root, requests, expected = tiny
    seen = []
    activate = LoRAManager.activate

    def spy(self, seq_loras, query_lens, device):
        seen.append({r.lora_int_id for r in seq_loras if r is not None})
        return activate(self, seq_loras, query_lens, device)

    monkeypatch.setattr(LoRAManager, "activate", spy)
    llm = engine(root, max_loras=1)
    loras = [requests["all8"], requests["qv4"], None]
    outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=GREEDY, lora_request=loras, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [expected[n][i] for i, n in enumerate(["all8", "qv4", None])]
    assert max(len(s) for s in seen) == 1 and len(set().union(*seen)) == 2
    assert_no_leak(llm)


def test_prefix_cache_never_mixes_adapters(tiny):
    """The same 37-token prompt under the base model, one adapter, the other, then the first again:
    only the repeat finds cached blocks, and every answer is its own."""
    root, requests, expected = tiny
    llm = engine(root, block_size=8)
    prompt = PROMPTS[1]
    for name, cached in [(None, 0), ("all8", 0), ("qv4", 0), ("all8", 32), (None, 32)]:
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, lora_request=requests.get(name),
                           use_tqdm=False)[0]  # fmt: skip
        assert out.num_cached_tokens == cached, name
        assert out.outputs[0].token_ids == expected[name][1], name
    assert_no_leak(llm)


def test_least_recently_used_adapter_evicted_and_reloaded(tiny):
    root, requests, expected = tiny
    llm = engine(root, max_loras=1, max_cpu_loras=1)
    manager = llm.engine.executor.runner.lora
    for name in ["all8", "qv4", "all8"]:
        out = llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY, lora_request=requests[name],
                           use_tqdm=False)[0]  # fmt: skip
        assert out.outputs[0].token_ids == expected[name][0]
        assert manager.loaded == [requests[name]]
    assert llm.engine.remove_lora(1) and not llm.engine.remove_lora(1)


def edited(tiny, tmp_path, **changes):
    """A copy of the rank-8 adapter with its config changed."""
    root, requests, _ = tiny
    directory = tmp_path / "edited"
    shutil.copytree(root / "all8", directory)
    config = json.loads((directory / "adapter_config.json").read_text())
    (directory / "adapter_config.json").write_text(json.dumps({**config, **changes}))
    return LoRARequest("edited", 9, str(directory))


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"use_dora": True}, "DoRA"),
        ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
        ({"bias": "lora_only"}, "trained biases"),
        ({"r": 32}, "rank 32 is above the maximum LoRA rank 8"),
        ({"peft_type": "IA3"}, "only LORA adapters"),
    ],
)
def test_unusable_adapters_are_refused_by_name(tiny, tmp_path, changes, message):
    llm = engine(tiny[0])
    with pytest.raises(ValueError, match=message):
        llm.generate(prompt_token_ids=[PROMPTS[0]], sampling_params=GREEDY, lora_request=edited(tiny, tmp_path,
                     **changes), use_tqdm=False)  # fmt: skip
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.engine.add_lora(LoRARequest("missing", 5, str(tmp_path / "nowhere")))
    assert not llm.engine.has_unfinished_requests()


def test_lora_needs_enable_lora(tiny):
    root, requests, _ = tiny
    llm = LLM(model=str(root / "model"), device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True)
    with pytest.raises(ValueError, match="enable_lora"):
        llm.generate(prompt_token_ids=[PROMPTS[0]], lora_request=requests["all8"], use_tqdm=False)


@pytest.mark.slow
def test_default_model_gguf_kept_quantized(tmp_path):
    """An adapter on the default model's GGUF, run on its quantized blocks (--device auto), against
    transformers + peft on the file dequantized: its tokens beside the base model's, in one batch."""
    from core.loader.source import default_model_path

    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    options = {"r": 8, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    peft_model = make_adapter(hf.eval(), tmp_path / "smol", options, True, seed=1)
    llm = LLM(max_model_len=256, kv_cache_bytes=64 << 20, enable_lora=True, max_lora_rank=8)
    ids = llm.get_tokenizer().encode("The capital of France is")
    with torch.no_grad():
        want = peft_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :].tolist()
        with peft_model.disable_adapter():
            base = peft_model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids) :]
    lora = LoRARequest("smol", 1, str(tmp_path / "smol"))
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=[ids, ids], sampling_params=params, lora_request=[lora, None], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == [want, base.tolist()]
    assert want != base.tolist()
    assert_no_leak(llm)
