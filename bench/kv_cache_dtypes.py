"""Each ``--kv-cache-dtype`` on the default model: its fidelity to transformers and its speed.

    python bench/kv_cache_dtypes.py [--steps 32] [--rounds 2]   # updates its section of bench/RESULTS.md

For every KV cache dtype the CPU platforms declare (``auto`` = float32, ``float16``, ``bfloat16``,
``fp8_e4m3``, ``fp8_e5m2``), the engine (default GGUF, float32 compute, native kernels,
2 threads as the process is pinned) decodes ``--steps`` greedy tokens of 8 chat prompts
with their logprobs, compared with transformers in float32 on the same weights (the GGUF
dequantized) fed the engine's tokens: tokens equal to transformers' argmax until the first
difference, and the logprob the engine gives its token against transformers' log-softmax
(max and mean |difference| over every step of every prompt). Then the batched workload
(32 x (128 + 128), ``core bench throughput``'s) in tok/s, the dtypes alternating for
``--rounds`` rounds (the machine's speed drifts), against the float32 compute ceiling of
``bench/cpu_vs_baselines.py`` (the workload's FLOPs at torch's float32 matmul rate, the
faster of a measure before and after). Not for CI.
"""

from __future__ import annotations

import argparse
import gc
import os
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import floors  # noqa: E402
from results import md_table, write_section  # noqa: E402

SECTION = "kv-cache-dtypes"
DTYPES = ("auto", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, a small robot",
    "Explain why the sky is blue in two sentences.",
    "Write a haiku about autumn leaves.",
    "List three uses of a paperclip.",
    "What is 17 times 23?",
    "Translate 'good morning' into Spanish and French.",
]


def fidelity(llm, hf_model, prompts: list[list[int]], steps: int) -> dict:
    """Greedy tokens and their logprobs against transformers' on the same token prefixes."""
    import torch
    from core.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, logprobs=1)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    equal, firsts, errors = 0, [], []
    for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        ours = out.outputs[0]
        with torch.no_grad():
            logits = hf_model(torch.tensor([prompt + ours.token_ids[:-1]])).logits[0, len(prompt) - 1 :]
        reference = logits.float().log_softmax(-1)
        first = next((s for s, t in enumerate(ours.token_ids) if int(reference[s].argmax()) != t), None)
        if first is None:
            equal += 1
        else:
            firsts.append(f"{i}@{first}")
        for step, token in enumerate(ours.token_ids):
            errors.append(abs(ours.logprobs[step][token].logprob - float(reference[step, token])))
    return {
        "equal": f"{equal}/{len(prompts)}",
        "first_differences": ", ".join(firsts) or "-",
        "max_logprob_error": max(errors),
        "mean_logprob_error": sum(errors) / len(errors),
    }


NUM_PROMPTS, LENGTH = 32, 128


def throughput(llm) -> float:
    """Output tok/s of the batched workload, as ``core bench throughput`` runs it."""
    from core.bench.throughput import run_throughput

    return run_throughput(llm, NUM_PROMPTS, LENGTH, LENGTH).output_tok_s


def render(rows: dict, steps: int, ceiling: tuple[float, float], command: str, load: tuple[float, float]) -> str:
    machine = floors.machine_info()
    rate, ceiling_tok_s = ceiling
    table = md_table(
        ["`--kv-cache-dtype`", "cache", "greedy equal", "first differences (prompt@step)",
         "logprob error max / mean", "32x(128+128) tok/s (rounds)", "vs auto", "x ceiling"],
        [
            [f"`{dtype}`", r["resolved"], r["equal"], r["first_differences"],
             f"{r['max_logprob_error']:.4f} / {r['mean_logprob_error']:.5f}",
             " / ".join(f"{x:.0f}" for x in r["tok_s"]),
             f"{max(r['tok_s']) / max(rows['auto']['tok_s']):.2f}x", f"{max(r['tok_s']) / ceiling_tok_s:.2f}x"]
            for dtype, r in rows.items()
        ],
    )  # fmt: skip
    return (
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); {machine['cpu']} "
        f"({machine['logical_cpus']} CPUs; {machine['flags']}), load average {load[0]:.1f} at the start, "
        f"{load[1]:.1f} at the end. Default model (GGUF Q4_1), float32 compute, native cpu_x86 kernels. "
        f"Compute ceiling of the batched workload: {ceiling_tok_s:.1f} tok/s (float32 matmul {rate / 1e9:.1f} "
        "GFLOP/s, the better of the measures at the start and the end). "
        f"Fidelity: {len(TEXTS)} chat prompts x {steps} greedy tokens against transformers in float32 on the "
        "GGUF's weights, fed our tokens; batched: 32 random 128-token prompts, 128 generated, no prefix "
        "caching, the dtypes alternating round by round (vs auto: best round against best round).\n\n" + table + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=32, help="greedy tokens a prompt in the fidelity check")
    p.add_argument("--rounds", type=int, default=2, help="alternating throughput rounds")
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="'' to leave it alone")
    args = p.parse_args(argv)
    load_start = os.getloadavg()[0]
    rate_start = floors.matmul_rate(2)

    import engine_part
    import hf_baseline
    import torch
    from core.loader.source import default_model_path
    from llamacpp import cache_dir
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = hf_baseline.float32_checkpoint(str(default_model_path()), cache_dir())
    tok = AutoTokenizer.from_pretrained(source)
    chats = [[{"role": "user", "content": t}] for t in TEXTS]
    prompts = [tok(tok.apply_chat_template(c, add_generation_prompt=True, tokenize=False)).input_ids for c in chats]
    hf_model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    rows = {}
    for dtype in DTYPES:
        llm = engine_part.make_llm(None, "gguf", prefix_caching=False, kv_cache_dtype=dtype)
        rows[dtype] = {"resolved": llm.engine.config.kv_cache_dtype, **fidelity(llm, hf_model, prompts, args.steps)}
        rows[dtype]["tok_s"] = [throughput(llm)]
        del llm
        gc.collect()
    for _ in range(args.rounds - 1):
        for dtype in DTYPES:
            llm = engine_part.make_llm(None, "gguf", prefix_caching=False, kv_cache_dtype=dtype)
            rows[dtype]["tok_s"].append(throughput(llm))
            del llm
            gc.collect()
    rate = max(rate_start, floors.matmul_rate(2))
    flops = floors.workload_flops(floors.read_gguf_shape(default_model_path()), NUM_PROMPTS, LENGTH, LENGTH)
    command = shlex.join(["python", "bench/kv_cache_dtypes.py", *argv])
    ceiling = (rate, NUM_PROMPTS * LENGTH / (flops / rate))
    text = render(rows, args.steps, ceiling, command, (load_start, os.getloadavg()[0]))
    print(text)
    if args.results:
        write_section(args.results, SECTION, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
