"""Pipeline parallelism end to end: ``-pp 2`` (worker processes or Ray actors), ``-pp 2 -tp 2``,
against one rank.

Tiny random models (3 layers: stages of 2 and 1; a tied LM head whose last stage reads the
embedding) on the reference platform, and the default model on the CPU plugin. Greedy tokens
must equal one rank's (a killed stage: tests/test_tensor_parallel.py, tests/test_distributed_server.py).
"""

import pytest
import torch
import transformers
from plugins.reference import ReferencePlatform

from core import LLM, SamplingParams

# several prompts, so a step's batch is cut into micro-batches; one long enough to be chunked
PROMPTS = [[5, 17, 200, 3], list(range(10, 47)), [9], [40, 41, 42, 43, 44, 45]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def build(directory, tied=False):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tied,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(directory)


def greedy(directory, **kwargs):
    llm = LLM(model=str(directory), device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True,
              max_model_len=128, max_num_batched_tokens=32, kv_cache_bytes=1 << 22, **kwargs)  # fmt: skip
    try:
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS, use_tqdm=False)
    finally:
        llm.shutdown()
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.slow  # ~20 s: two spawned workers import torch and transformers
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_pp2_greedy_equals_one_rank(tied, tmp_path):
    build(tmp_path, tied)
    assert greedy(tmp_path, pipeline_parallel_size=2) == greedy(tmp_path)


@pytest.mark.slow  # ~40 s: four workers on 2 cores
def test_pp2_tp2_greedy_equals_one_rank(tmp_path):
    build(tmp_path)
    assert greedy(tmp_path, pipeline_parallel_size=2, tensor_parallel_size=2) == greedy(tmp_path)


@pytest.mark.slow
def test_ray_pp2_greedy_equals_one_rank(tmp_path):
    """Stages as Ray actors on a local Ray instance the test starts."""
    ray = pytest.importorskip("ray")
    build(tmp_path)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        expected = greedy(tmp_path)
        assert greedy(tmp_path, pipeline_parallel_size=2, distributed_executor_backend="ray") == expected
    finally:
        ray.shutdown()


def test_each_stage_holds_its_layers_and_kv_cache(tmp_path):
    build(tmp_path)
    llm = LLM(model=str(tmp_path), device=ReferencePlatform(), dtype="float32", skip_tokenizer_init=True,
              max_model_len=128, kv_cache_bytes=1 << 22, pipeline_parallel_size=2)  # fmt: skip
    try:
        plans = llm.engine.executor.call_all("plan_kv_cache", timeout=60)
        layers = llm.engine.executor.call_all("describe", timeout=60)
    finally:
        llm.shutdown()
    assert [d.num_layers for d in layers] == [2, 1]
    # the same KV budget per stage: the stage of one layer fits twice the blocks
    assert plans[1].num_blocks == 2 * plans[0].num_blocks


@pytest.mark.slow  # ~30 s: the default model (SmolLM2-135M, 30 layers) in two stages on the CPU plugin
def test_default_model_pp2_greedy_equals_one_rank(monkeypatch):
    monkeypatch.setenv("CORE_CPU_OMP_THREADS_BIND", "0|1")
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)

    def run(**kwargs):
        llm = LLM(device="cpu_x86", max_model_len=256, **kwargs)
        try:
            return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        finally:
            llm.shutdown()

    expected = run()
    assert run(pipeline_parallel_size=2) == expected
