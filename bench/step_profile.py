"""Where an engine step goes: the platform runner's forward, the logits, and the rest (Python).

    python bench/step_profile.py [MODEL.gguf] [--tokens 128] [--rounds 3]
    python bench/step_profile.py --batch 32 --prompt-len 128   # the batched workload's steps

Wall time on the engine's threads (``CORE_CPU_QUANT_ACTIVATIONS`` / ``CORE_CPU_KERNEL_ISA`` as
usual): ``--batch`` requests of ``--prompt-len`` random tokens, then ``--tokens`` decode steps,
per round; prefill steps (those carrying prompt tokens) and decode steps are reported apart.
The forward and logits are timed by wrapping the runner's ``forward`` and ``compute_logits``;
the rest is the engine's Python (scheduler, batch building, sampler, outputs). Not for CI.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", nargs="?", default=None, help="GGUF file (default: the default model)")
    p.add_argument("--tokens", type=int, default=128, help="decode steps a round")
    p.add_argument("--batch", type=int, default=1, help="requests decoded together")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kv-cache-dtype", default="auto", help="--kv-cache-dtype (auto: the compute dtype)")
    p.add_argument("--dtype", default="float32", help="compute dtype (float32, bfloat16)")
    args = p.parse_args()
    for name in ("tokens", "batch", "prompt_len", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}")

    import engine_part
    from core.bench.stats import random_prompts
    from core.sampling_params import SamplingParams

    engine = engine_part.make_llm(
        args.model, "gguf", prefix_caching=False, kv_cache_dtype=args.kv_cache_dtype, dtype=args.dtype
    ).engine
    runner = engine.executor.runner.platform.runner
    spent = {"forward": 0.0, "logits": 0.0}

    def timed(name, fn):
        def call(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - start

        return call

    def report(kind: str, steps: int, total: float, tokens: int) -> None:
        ms = {name: 1e3 * value / steps for name, value in spent.items()}
        rest = 1e3 * total / steps - ms["forward"] - ms["logits"]
        print(
            f"  {kind}: {steps} steps, {tokens / total:.1f} tok/s; a step {1e3 * total / steps:.2f} ms = "
            f"forward {ms['forward']:.2f} + logits {ms['logits']:.2f} + rest {rest:.2f}"
        )

    runner.forward, runner.compute_logits = timed("forward", runner.forward), timed("logits", runner.compute_logits)
    print(
        f"{args.model or 'default model'}, kernels {engine.platform.get_extension('kernel_isa')}, batch {args.batch}, "
        f"{engine.config.dtype} compute, {engine.config.kv_cache_dtype} K/V cache"
    )
    vocab = engine.loaded.hf_config.vocab_size
    for rnd in range(args.rounds):
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens + 1, ignore_eos=True)
        for i, prompt in enumerate(random_prompts(args.batch, args.prompt_len, vocab, seed=rnd)):
            engine.add_request(f"profile-{rnd}-{i}", params=params, prompt_token_ids=prompt)
        spent.update(forward=0.0, logits=0.0)
        steps, start, started = 0, time.perf_counter(), set()
        while len(started) < args.batch:  # until every request has its first token
            started.update(out.request_id for out in engine.step() if out.outputs[0].token_ids)
            steps += 1
        report("prefill", steps, time.perf_counter() - start, args.batch * args.prompt_len)
        spent.update(forward=0.0, logits=0.0)
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        report("decode", steps, time.perf_counter() - start, steps * args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
