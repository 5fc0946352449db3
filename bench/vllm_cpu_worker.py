"""vLLM's CPU backend on one workload spec; runs inside the cached vLLM venv (see ``bench/vllm_cpu.py``).

    <vllm venv>/bin/python bench/vllm_cpu_worker.py SPEC.json

The spec (written by ``vllm_cpu.measure``) holds the model folder, the dtype and the token-id
prompts the other systems get; the figures come back as one ``RESULT {json}`` line. It imports
nothing from this project: the vLLM venv has its own torch and transformers. The ``__main__``
guard is needed: vLLM starts its engine core in a spawned process that re-imports this file.
"""

from __future__ import annotations

import json
import sys
import time


def decode_tok_s(llm, prompt: list[int], n_gen: int) -> float:
    """Batch-1 decode rate: ``n_gen`` tokens after the first over the time since the first arrived.

    Steps the engine and stamps each step that brings a new token (prefill excluded); best of two.
    """
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine, best = llm.llm_engine, 0.0
    for attempt in range(2):
        params = SamplingParams(temperature=0.0, max_tokens=n_gen + 1, ignore_eos=True)
        engine.add_request(f"decode-{attempt}", TokensPrompt(prompt_token_ids=prompt), params)
        stamps, seen = [], 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                count = len(out.outputs[0].token_ids)
                if count > seen:
                    stamps.extend([time.perf_counter()] * (count - seen))
                    seen = count
        if len(stamps) != n_gen + 1:
            raise RuntimeError(f"expected {n_gen + 1} tokens, stamped {len(stamps)}")
        best = max(best, n_gen / (stamps[-1] - stamps[0]))
    return best


def timed_generate(llm, prompts: list[list[int]], max_tokens: int) -> tuple[float, int]:
    """``(seconds, generated tokens)`` of one greedy ``generate`` over ``prompts`` (EOS ignored)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(o.outputs[0].token_ids) for o in outputs)


def measure(spec: dict) -> dict:
    """Startup, batch-1 decode, batched throughput and one-prompt prefill of one configuration."""
    import vllm
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(
        spec["model_dir"], dtype=spec["dtype"], max_model_len=spec["max_model_len"],
        max_num_seqs=len(spec["batch_prompts"]), enable_prefix_caching=False, seed=0,
    )  # fmt: skip
    result = {
        "vllm_version": vllm.__version__,
        "dtype": spec["dtype"],
        "startup_s": time.perf_counter() - start,
        "max_num_batched_tokens": llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens,
    }
    timed_generate(llm, spec["batch_prompts"][:1], 2)  # warm-up, not timed
    result["decode_tok_s"] = decode_tok_s(llm, spec["decode_prompt"], spec["decode_tokens"])
    elapsed, generated = timed_generate(llm, spec["batch_prompts"], spec["gen_len"])
    result["throughput"] = {"elapsed_s": elapsed, "output_tokens": generated,
                            "prompt_tokens": sum(map(len, spec["batch_prompts"]))}  # fmt: skip
    result["output_tok_s"] = generated / elapsed
    prefill = min(timed_generate(llm, [spec["prefill_prompt"]], 1)[0] for _ in range(2))
    result["prefill_tok_s"] = len(spec["prefill_prompt"]) / prefill
    return result


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec_in = json.load(f)
    print("RESULT " + json.dumps(measure(spec_in)), flush=True)
