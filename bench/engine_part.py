"""This engine's side: ``core.LLM`` on the default GGUF with whatever cpu_x86 plugin is installed."""

from __future__ import annotations

import time
from typing import Any


def make_llm(model: str | None, quantization: str | None, prefix_caching: bool = True):
    """An offline engine on the CPU in float32 (``quantization``: None, ``"gguf"`` or ``"int8"``)."""
    from core import LLM

    return LLM(model, device="auto", dtype="float32", quantization=quantization, enable_prefix_caching=prefix_caching)


def _time(llm: Any, prompt: list[int], max_tokens: int) -> float:
    from core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate(prompt_token_ids=[prompt], sampling_params=params, use_tqdm=False)
    return time.perf_counter() - start


def decode_tok_s(llm: Any, prompt: list[int], n_gen: int) -> float:
    """Batch-1 decode rate: (time for n_gen + 1 tokens - time for 1 token) spread over n_gen."""
    _time(llm, prompt, 2)  # warm-up
    first = min(_time(llm, prompt, 1) for _ in range(2))
    full = _time(llm, prompt, n_gen + 1)
    return n_gen / (full - first)


def measure(
    model: str | None,
    quantization: str | None,
    prompt: list[int],
    n_gen: int,
    num_seqs: int,
    prompt_len: int,
    seed: int,
) -> dict:
    """Batch-1 decode and ``num_seqs`` x (``prompt_len`` + ``n_gen``) throughput of one configuration."""
    from core.bench.throughput import run_throughput

    llm = make_llm(model, quantization, prefix_caching=False)
    result: dict[str, Any] = {"quantization": quantization, "decode_tok_s": decode_tok_s(llm, prompt, n_gen)}
    result["platform"] = llm.engine.platform.name
    result["weights_bytes"] = llm.engine.loaded.weights_bytes
    tp = run_throughput(llm, num_seqs, prompt_len, n_gen, seed)
    result["throughput"] = tp.as_dict()
    result["output_tok_s"] = tp.output_tok_s
    return result
