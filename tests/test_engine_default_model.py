"""The offline API on the default model (SmolLM2-135M-Instruct GGUF): text, chat, sampling features."""

import numpy as np
import pytest

from core import LLM, SamplingParams

BASIC_PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]

#: prompts of 40-150 tokens: prefill kernels that take a prompt in tiles of tokens and keys (on
#: cpu_x86 with AMX: 16 tokens x 32 keys) see several tiles, the last ones cut short
LONG_PROMPTS = [
    "Photosynthesis is the process by which green plants, algae and some bacteria turn light into "
    "chemical energy. In the chloroplasts, chlorophyll absorbs mostly blue and red light, and the energy "
    "splits water molecules, releasing oxygen. The plant then uses",
    "The history of the printing press begins long before Gutenberg. Woodblock printing was used in China "
    "by the ninth century, and movable type made of baked clay was invented there around 1040. Metal "
    "movable type appeared in Korea in the thirteenth century, where the oldest surviving book printed "
    "with it dates from 1377. In Europe, Johannes Gutenberg developed a press around 1440 that combined "
    "movable metal type, oil-based ink and a screw press adapted from those used to make wine and olive "
    "oil. His Bible, printed in Mainz, showed that books could be made quickly and cheaply, and within "
    "fifty years presses were running in more than two hundred European cities. The consequences were",
]


@pytest.fixture(scope="module")
def llm():
    engine = LLM(max_model_len=512, max_num_seqs=32, kv_cache_bytes=256 << 20)
    yield engine
    bm = engine.engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks, "KV blocks leaked"


def test_basic_prompts_give_sensible_text(llm):
    outs = llm.generate(BASIC_PROMPTS, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)
    texts = {o.prompt: o.outputs[0].text for o in outs}
    assert "Paris" in texts["The capital of France is"]
    for prompt, text in texts.items():
        assert len(text.split()) >= 5, f"{prompt!r} -> {text!r}"
        assert "\ufffd" not in text
    assert all(o.outputs[0].finish_reason in ("stop", "length") for o in outs)


@pytest.mark.parametrize("prompts", [BASIC_PROMPTS, LONG_PROMPTS], ids=["short", "long"])
def test_greedy_tokens_and_logprobs_match_transformers(llm, prompts):
    """The platform's default path on the file's blocks (on cpu_x86: int16 activations on its
    Q4_1/Q8_0 weights) against transformers on the same file dequantized to float32: the same
    greedy tokens, logprobs within 2e-3, batched (prompts of different lengths share steps)."""
    import torch
    import transformers
    from core.loader.source import default_model_path

    path = default_model_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    for out in llm.generate(prompts, params, use_tqdm=False):
        ids = tokenizer(out.prompt).input_ids + out.outputs[0].token_ids
        with torch.no_grad():
            logits = hf(torch.tensor([ids])).logits[0, len(out.prompt_token_ids) - 1 : -1]
        ref = torch.log_softmax(logits.float(), -1)
        assert out.outputs[0].token_ids == ref.argmax(-1).tolist(), out.prompt
        for step, token in enumerate(out.outputs[0].token_ids):
            mine = out.outputs[0].logprobs[step][token].logprob
            assert abs(mine - ref[step, token].item()) < 2e-3, (out.prompt, step, mine, ref[step, token].item())


def test_default_model_runs_on_the_platform_runner_fast_path(llm):
    """On a platform whose runner runs the model from its description (cpu_x86's fused
    decoder), the default model takes that path, not the eager fallback."""
    runner = llm.engine.platform.runner
    if not hasattr(runner, "fused"):
        pytest.skip(f"{llm.engine.platform.name}'s runner has no fused path")
    assert runner.fused is not None and runner.model is llm.engine.executor.runner.model


def test_chat_uses_the_template(llm):
    out = llm.chat(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0.0, max_tokens=20),
        use_tqdm=False,
    )[0]
    assert "Paris" in out.outputs[0].text
    assert out.prompt_token_ids[0] == llm.get_tokenizer().convert_tokens_to_ids("<|im_start|>")


def test_seeded_sampling_is_independent_of_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    alone = llm.generate(["The future of AI is"], params, use_tqdm=False)[0].outputs[0].text
    others = [SamplingParams(temperature=1.0, max_tokens=16)] * 15
    batch = llm.generate(["The future of AI is"] + (BASIC_PROMPTS * 4)[:15], [params] + others, use_tqdm=False)
    assert batch[0].outputs[0].text == alone


def test_n_stop_strings_and_logprobs(llm):
    params = SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=12, logprobs=2, stop=["\n"])
    (out,) = llm.generate(["Write a list of fruits:"], params, use_tqdm=False)
    assert len(out.outputs) == 3 and len({c.text for c in out.outputs}) > 1
    for c in out.outputs:
        assert "\n" not in c.text
        assert len(c.logprobs) == len(c.token_ids) and all(len(entry) >= 2 for entry in c.logprobs)
        if c.finish_reason == "stop":
            assert c.stop_reason == "\n"


def test_stop_string_is_cut_and_prompt_logprobs(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=24)
    full = llm.generate(["The capital of France is"], greedy, use_tqdm=False)[0].outputs[0].text
    cut = llm.generate(
        ["The capital of France is"],
        SamplingParams(temperature=0.0, max_tokens=24, stop=["Paris"], prompt_logprobs=1),
        use_tqdm=False,
    )[0]
    assert cut.outputs[0].text == full[: full.index("Paris")]
    assert cut.outputs[0].finish_reason == "stop" and cut.outputs[0].stop_reason == "Paris"
    assert cut.prompt_logprobs[0] is None and len(cut.prompt_logprobs) == len(cut.prompt_token_ids)


def test_too_long_request_is_rejected_clearly(llm):
    with pytest.raises(ValueError, match="maximum context length is 512 tokens"):
        llm.generate(["word " * 600], SamplingParams(max_tokens=10), use_tqdm=False)
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate(prompt_token_ids=[[10**9]], use_tqdm=False)
    with pytest.raises(TypeError, match="prompt_token_ids"):  # token ids where text goes
        llm.generate([[1, 2, 3]], use_tqdm=False)
    with pytest.raises(ValueError, match="prompt token ids must be integers, got str 'input_ids'"):
        llm.generate(prompt_token_ids=[{"input_ids": [1, 2]}], use_tqdm=False)  # a tokenizer's output as it is
    assert not llm.engine.has_unfinished_requests()
    # numpy's integers (an array's items) are taken as plain ints
    ids = llm.generate(prompt_token_ids=[list(np.array([1, 2, 3]))], use_tqdm=False)[0].prompt_token_ids
    assert ids == [1, 2, 3] and all(type(t) is int for t in ids)


def test_abort_frees_blocks(llm):
    engine = llm.engine
    engine.add_request("a", prompt="Tell me a long story about dragons.", params=SamplingParams(max_tokens=200))
    engine.step()
    engine.step()
    assert engine.block_manager.usage > 0
    out = engine.abort_request("a")
    assert out.finished and out.outputs[0].finish_reason == "abort"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_total_blocks
