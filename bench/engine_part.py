"""This engine's side: ``core.LLM`` on the default GGUF with whatever cpu_x86 plugin is installed."""

from __future__ import annotations

import os
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


def memory_pages() -> dict[str, float]:
    """This process's resident memory and how much of its anonymous memory is in transparent huge
    pages (MB, from ``/proc/self/smaps_rollup``; empty off Linux): a decode step that streams its
    weights from 4 KiB pages runs ~1.27x slower (bench/RESULTS.md, issue 47 stop 54), and the kernel
    falls back to them when it finds no free 2 MiB page."""
    try:
        lines = open("/proc/self/smaps_rollup").read().splitlines()
    except OSError:
        return {}
    fields = {name: int(rest.split()[0]) / 1024 for name, _, rest in (line.partition(":") for line in lines[1:])}
    return {"rss_mb": fields["Rss"], "anon_huge_mb": fields["AnonHugePages"]}


#: prompt tokens of the batch-1 decode workload, the same for every bench and every system measured
DECODE_PROMPT_LEN = 16


def decode_prompt(vocab: int, seed: int = 0) -> list[int]:
    """The batch-1 decode workload's prompt: :data:`DECODE_PROMPT_LEN` ids drawn uniformly from
    ``[0, vocab)`` with ``seed`` (``core.bench.stats.random_prompts``).

    Random ids, not a fixed run like ``100..115``: that one makes the default model repeat two
    tokens for the whole generation, which is not what a user's decode looks like.
    """
    from core.bench.stats import random_prompts

    return random_prompts(1, DECODE_PROMPT_LEN, vocab, seed)[0]


def decode_tok_s(llm: Any, prompt: list[int], n_gen: int) -> float:
    """Batch-1 decode rate of ``llm`` as a user's ``LLM.generate`` gets it: the one method of bench/.

    - warm-up: one request of ``prompt`` for 2 tokens through ``LLM.generate`` (first-call costs);
    - timed: two requests of ``prompt``, greedy, ``ignore_eos``, ``n_gen + 1`` tokens each, driven
      step by step as ``LLM.generate`` drives them, each new token stamped as its step returns;
    - rate: ``n_gen`` over the time from the first token's stamp to the last one's, so the prompt's
      prefill and the first token are excluded and everything else of a decode step (scheduler,
      model, sampler, detokenizer, Python) is included; the better of the two requests.

    Use :func:`decode_prompt` for ``prompt`` so every bench times the same workload.
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


def streamed_bytes(llm: Any) -> int:
    """Weight bytes a batch-1 decode step of ``llm`` reads: all its weights but the embedding table
    when that is held apart from the lm_head (a dense copy for lookups beside a quantized tied
    lm_head: a step reads one row of it)."""
    model = llm.engine.loaded.model
    emb = model.embed_tokens
    apart = model.lm_head.weight is not emb
    return llm.engine.loaded.weights_bytes - (emb.numel() * emb.element_size() if apart else 0)


def copy_bandwidth() -> float:
    """Bytes/s of a large copy on this process's compute threads (``floors.memory_bandwidth`` on
    ``OMP_NUM_THREADS`` threads, else on every CPU the process may use); torch's thread count put
    back after it."""
    import floors
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    engine_threads = torch.get_num_threads()
    try:
        return floors.memory_bandwidth(threads)
    finally:
        torch.set_num_threads(engine_threads)


def decode_floor(rate: float, llm: Any, bandwidths: list[float], load: list[float]) -> dict[str, Any]:
    """A batch-1 decode ``rate`` of ``llm`` against its bandwidth floor, ``max(bandwidths) /
    streamed_bytes(llm)``: a step that only streamed its weights once at the speed of a large copy.

    Take ``bandwidths`` with :func:`copy_bandwidth` in the same process, once before the engine is
    built and once after its figures (not right before the decode: in one process under load, a
    decode right after a copy ran 0.94x one without, 6 of 6 rounds), so a machine whose speed
    drifts over minutes is compared with itself. ``load``: the 1-minute load average at the same
    two moments, recorded beside the figures.
    """
    floor = max(bandwidths) / streamed_bytes(llm)
    return {
        "bandwidth_gb_s": [b / 1e9 for b in bandwidths], "floor_tok_s": floor, "floor_ratio": rate / floor,
        "load_1min": load, "memory_pages": memory_pages(),
    }  # fmt: skip


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
    gen_len: int,
    seed: int,
    prefill_len: int,
    dtype: str = "float32",
) -> dict:
    """Batch-1 decode of ``n_gen`` tokens against its floor (:func:`decode_floor`), ``num_seqs`` x
    (``prompt_len`` + ``gen_len``) throughput and one ``prefill_len``-token prompt's prefill of one configuration
    (computing in ``dtype``)."""
    from core.bench.stats import random_prompts
    from core.bench.throughput import run_throughput, vocab_of

    load, bandwidths = [os.getloadavg()[0]], [copy_bandwidth()]
    llm = make_llm(model, quantization, prefix_caching=False, dtype=dtype)
    result: dict[str, Any] = {"quantization": quantization, "decode_tok_s": decode_tok_s(llm, prompt, n_gen)}
    result["platform"] = llm.engine.platform.name
    result["weights_bytes"] = llm.engine.loaded.weights_bytes
    result["streamed_bytes"] = streamed_bytes(llm)
    tp = run_throughput(llm, num_seqs, prompt_len, gen_len, seed)
    result["throughput"] = tp.as_dict()
    result["output_tok_s"] = tp.output_tok_s
    vocab, special = vocab_of(llm)
    result["prefill_tok_s"] = prefill_tok_s(llm, random_prompts(1, prefill_len, vocab, seed, exclude=special)[0])
    bandwidths.append(copy_bandwidth())
    load.append(os.getloadavg()[0])
    result["decode_floor"] = decode_floor(result["decode_tok_s"], llm, bandwidths, load)
    return result
