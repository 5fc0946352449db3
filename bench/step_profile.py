"""Where a batch-1 decode step goes: the platform runner's forward, the logits, and the rest (Python).

    python bench/step_profile.py [MODEL.gguf] [--tokens 128] [--rounds 3]

Wall time on the engine's threads (``CORE_CPU_QUANT_ACTIVATIONS`` / ``CORE_CPU_KERNEL_ISA`` as
usual): ``--tokens`` steps after a 16-token prompt, per round. The forward and logits are timed
by wrapping the runner's ``forward`` and ``compute_logits``; the rest is the engine's Python
(scheduler, batch building, sampler, outputs). Not for CI.
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
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    import engine_part
    from core.sampling_params import SamplingParams

    engine = engine_part.make_llm(args.model, "gguf", prefix_caching=False).engine
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

    runner.forward, runner.compute_logits = timed("forward", runner.forward), timed("logits", runner.compute_logits)
    print(f"{args.model or 'default model'}, kernels {engine.platform.kernels.isa}")
    for rnd in range(args.rounds):
        params = SamplingParams(temperature=0.0, max_tokens=args.tokens + 1, ignore_eos=True)
        engine.add_request(f"profile-{rnd}", params=params, prompt_token_ids=list(range(100, 116)))
        engine.step()  # the prefill
        spent.update(forward=0.0, logits=0.0)
        steps, start = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            engine.step()
            steps += 1
        total = time.perf_counter() - start
        ms = {name: 1e3 * value / steps for name, value in spent.items()}
        rest = 1e3 * total / steps - ms["forward"] - ms["logits"]
        print(
            f"  {steps / total:.1f} tok/s; a step {1e3 * total / steps:.2f} ms = forward {ms['forward']:.2f} "
            f"+ logits {ms['logits']:.2f} + rest {rest:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
