"""End-to-end figures of the engine on this platform (not a test): python plugin_cpu_x86/bench_engine.py

Default model (SmolLM2-135M Q4_1 GGUF), greedy, ignore_eos:
  decode: batch-1 decode ms/token = (t(129 tokens) - t(1 token)) / 128, best of --reps;
  batch:  --num-prompts concurrent requests x (--input-len prompt + --output-len output),
          generated tok/s (core's throughput bench), best of --reps.
Set CORE_CPU_QUANT_ACTIVATIONS=1 for the int8-activation kernel. --runner picks the
execution: the fused native decoder (default), eager (CORE_CPU_FUSED_DECODE=0), or eager
under torch.compile (not offered by the platform: measured 2.5x slower than eager, every
native kernel is an opaque call to it). The machine's 1-minute load average is printed
with each figure: compare runs at similar load.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from core.bench.throughput import run_throughput

from core import LLM, SamplingParams


def decode_ms(llm: LLM, reps: int) -> float:
    """Best batch-1 decode time per token, in ms."""

    def run(n: int) -> float:
        start = time.perf_counter()
        params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        llm.generate(["The history of the Roman Empire"], params, use_tqdm=False)
        return time.perf_counter() - start

    run(8)  # warm-up
    return min(run(129) - run(1) for _ in range(reps)) / 128 * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--runner", choices=("fused", "eager", "compile"), default="fused")
    args = parser.parse_args()
    os.environ["CORE_CPU_FUSED_DECODE"] = "1" if args.runner == "fused" else "0"
    llm = LLM(max_model_len=512, max_num_seqs=args.num_prompts, kv_cache_bytes=512 << 20, enable_prefix_caching=False)
    if args.runner == "compile":
        llm.engine.executor.runner.model = torch.compile(llm.engine.executor.runner.model, dynamic=True)
    ms = decode_ms(llm, args.reps)
    print(f"decode batch 1: {ms:.2f} ms/token = {1e3 / ms:.1f} tok/s (load {os.getloadavg()[0]:.2f})")
    best = max(
        (run_throughput(llm, args.num_prompts, args.input_len, args.output_len) for _ in range(args.reps)),
        key=lambda r: r.output_tok_s,
    )
    print(
        f"{args.num_prompts} x ({args.input_len} + {args.output_len}): {best.elapsed_s:.1f} s, "
        f"{best.output_tok_s:.1f} generated tok/s (load {os.getloadavg()[0]:.2f})"
    )


if __name__ == "__main__":
    main()
