"""This engine's side: ``core.LLM`` on the default GGUF with whatever cpu_x86 plugin is installed."""

from __future__ import annotations

import time
from typing import Any


def make_llm(
    model: str | None, quantization: str | None, prefix_caching: bool = True, kv_cache_dtype: str = "auto",
    dtype: str = "float32",
):  # fmt: skip
    """An offline engine on the CPU in ``dtype`` (float32 unless asked).

    ``quantization``: None or ``"gguf"`` (GGUF blocks kept as they are), ``"int8"``, or
    ``"fp32"``: the same weights dequantized into a float32 checkpoint (see ``hf_baseline``).
    ``kv_cache_dtype``: ``--kv-cache-dtype`` (``"fp8"``: one-byte E4M3 blocks).
    """
    from core import LLM

    if quantization == "fp32":
        import hf_baseline
        from core.loader.source import resolve_model
        from llamacpp import cache_dir

        model, quantization = str(hf_baseline.float32_checkpoint(str(resolve_model(model)), cache_dir())), None
    # offline nobody waits on a step: the big budget, as `core bench throughput` and llama-batched-bench (-b 2048)
    return LLM(
        model, device="auto", dtype=dtype, quantization=quantization, enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=2048, kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip


def decode_tok_s(llm: Any, prompt: list[int], n_gen: int) -> float:
    """Batch-1 decode rate: ``n_gen`` tokens after the first, over the time since the first arrived.

    Drives the engine step by step and stamps each new token (prefill excluded); best of two.
    """
    from core.sampling_params import SamplingParams

    engine, best = llm.engine, 0.0
    llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    for attempt in range(2):
        params = SamplingParams(temperature=0.0, max_tokens=n_gen + 1, ignore_eos=True)
        engine.add_request(f"decode-{attempt}", params=params, prompt_token_ids=prompt)
        stamps, seen = [], 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                count = len(out.outputs[0].token_ids)
                if count > seen:
                    stamps.append(time.perf_counter())
                    seen = count
        if len(stamps) != n_gen + 1:
            raise RuntimeError(f"expected {n_gen + 1} token steps, stamped {len(stamps)}")
        best = max(best, n_gen / (stamps[-1] - stamps[0]))
    return best


def prefill_tok_s(llm: Any, prompt: list[int]) -> float:
    """One prompt's prefill rate: its tokens over the time to its first generated token; best of two.

    Needs prefix caching off (else the second run finds the prompt cached).
    """
    from core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    best = float("inf")
    for _ in range(2):
        start = time.perf_counter()
        llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
        best = min(best, time.perf_counter() - start)
    return len(prompt) / best


def measure(
    model: str | None,
    quantization: str | None,
    prompt: list[int],
    n_gen: int,
    num_seqs: int,
    prompt_len: int,
    seed: int,
    prefill_len: int,
    dtype: str = "float32",
) -> dict:
    """Batch-1 decode, ``num_seqs`` x (``prompt_len`` + ``n_gen``) throughput and one ``prefill_len``-token
    prompt's prefill of one configuration (computing in ``dtype``)."""
    from core.bench.stats import random_prompts
    from core.bench.throughput import run_throughput, vocab_of

    llm = make_llm(model, quantization, prefix_caching=False, dtype=dtype)
    result: dict[str, Any] = {"quantization": quantization, "decode_tok_s": decode_tok_s(llm, prompt, n_gen)}
    result["platform"] = llm.engine.platform.name
    result["weights_bytes"] = llm.engine.loaded.weights_bytes
    # bytes a decode step reads: not the embedding table when it is held apart from lm_head
    # (a dense copy for lookups beside a quantized tied lm_head): a step reads one row of it
    model = llm.engine.loaded.model
    emb = model.embed_tokens
    apart = model.lm_head.weight is not emb
    result["streamed_bytes"] = result["weights_bytes"] - (emb.numel() * emb.element_size() if apart else 0)
    tp = run_throughput(llm, num_seqs, prompt_len, n_gen, seed)
    result["throughput"] = tp.as_dict()
    result["output_tok_s"] = tp.output_tok_s
    vocab, special = vocab_of(llm)
    result["prefill_tok_s"] = prefill_tok_s(llm, random_prompts(1, prefill_len, vocab, seed, exclude=special)[0])
    return result
