"""Tensor parallelism end to end: TP=2 engines (worker processes, gloo) against TP=1.

Tiny random models of every architecture, one of them with fewer KV heads than ranks
(replicated) and one with a vocabulary that does not split evenly. Greedy tokens must
equal TP=1's; a killed worker (of a TP=2 or a PP=2 engine) must end the engine with an error
naming its rank (tests/test_pipeline_parallel.py has the rest of PP=2).
"""

import os
import signal
import time

import pytest
import torch
import transformers
from core.distributed.executor import WorkerFailed
from plugins.reference import ReferencePlatform

from core import LLM, SamplingParams

ARCHS = {
    "llama": (transformers.LlamaConfig, {"num_key_value_heads": 2}),
    "llama_tied_odd_vocab": (transformers.LlamaConfig, {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    "qwen2_one_kv_head": (transformers.Qwen2Config, {"num_key_value_heads": 1}),
    "mistral": (transformers.MistralConfig, {"num_key_value_heads": 2, "sliding_window": None}),
}
MODEL_CLASSES = {
    transformers.LlamaConfig: transformers.LlamaForCausalLM,
    transformers.Qwen2Config: transformers.Qwen2ForCausalLM,
    transformers.MistralConfig: transformers.MistralForCausalLM,
}
PROMPTS = [[5, 17, 200, 3], list(range(10, 47)), [9]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def build(arch, directory):
    config_cls, extra = ARCHS[arch]
    torch.manual_seed(0)
    config = config_cls(
        vocab_size=257 if "odd_vocab" in arch else 256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        **extra,
    )
    MODEL_CLASSES[config_cls](config).save_pretrained(directory)


def greedy(directory, **kwargs):
    llm = LLM(model=str(directory), device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True,
              max_model_len=128, kv_cache_bytes=1 << 22, **kwargs)  # fmt: skip
    try:
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow  # ~20-30 s each on 2 cores: two spawned workers import torch and transformers
@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_tp2_greedy_equals_tp1(arch, tmp_path):
    build(arch, tmp_path)
    assert greedy(tmp_path, tensor_parallel_size=2, distributed_executor_backend="mp") == greedy(tmp_path)


@pytest.mark.parametrize("split", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_killed_worker_ends_the_engine_naming_its_rank(split, tmp_path):
    build("llama", tmp_path)
    llm = LLM(model=str(tmp_path), device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True,
              max_model_len=128, kv_cache_bytes=1 << 22, **split)  # fmt: skip
    procs = list(llm.engine.executor.procs)  # under tensor parallelism alone rank 0 runs in this process
    os.kill(procs[-1].pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1") as info:
        llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
    assert info.value.rank == 1
    assert time.monotonic() - start < 10
    assert not any(p.is_alive() for p in procs), "a worker process outlived the failure"


@pytest.mark.slow
def test_ray_tp2_greedy_equals_tp1(tmp_path):
    """Ranks as Ray actors on a local Ray instance the test starts (about 40 s on 2 cores, half of it Ray's start)."""
    ray = pytest.importorskip("ray")
    build("llama", tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        assert greedy(tmp_path, tensor_parallel_size=2, distributed_executor_backend="ray") == greedy(tmp_path)
        groups = ray.util.placement_group_table().values()
        assert groups and all(g["state"] == "REMOVED" for g in groups), "shutdown left a placement group"
    finally:
        ray.shutdown()


def test_offline_api_runs_one_replica(tmp_path):
    with pytest.raises(ValueError, match="data_parallel_size=2: LLM runs one engine"):
        LLM(model=str(tmp_path), device=ReferencePlatform(), data_parallel_size=2)
