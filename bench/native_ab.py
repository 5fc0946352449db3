"""Two builds of the cpu_x86 kernel library in one process: the fused decoder's batch-1 or prefill step, A/B.

    python bench/native_ab.py BASE.so NEW.so [--rounds 8] [--tokens 128] [--dtype bfloat16]
    python bench/native_ab.py BASE.so NEW.so --prefill 512 --rounds 20 --dtype bfloat16

Each build drives its own engine on the default model (greedy, a 16-token prompt, ``--tokens``
decode steps a round); the rounds alternate, so a noisy spell hits both. Times the native
``decode`` call alone (the forward of one step; the prefill step is dropped), so neither the
engine's Python nor the logits count. ``--prefill N`` times the prefill step instead: one
prompt of N random tokens a round, one generated token. On a loaded machine most steps are
descheduled at least once: the median says little there, and the 10th percentile (steps run
undisturbed) is the figure to compare. Both engines must produce the same tokens. Make a build with
``cmake -G Ninja -S plugin_cpu_x86 -B /tmp/ab-build && ninja -C /tmp/ab-build`` (its
``_cx86.so``) on each side of a change. Not for CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def quantile(xs: list[float], p: float) -> float:
    """The ``p`` quantile of ``xs`` (nearest rank)."""
    return sorted(xs)[int(p * (len(xs) - 1))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("libraries", nargs=2, help="the two builds' _cx86.so: base, then new")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--tokens", type=int, default=128, help="decode steps a round")
    p.add_argument("--dtype", default="float32", help="compute dtype (float32, bfloat16)")
    p.add_argument("--prefill", type=int, default=0, metavar="N", help="time the prefill of an N-token prompt")
    args = p.parse_args()
    for so in args.libraries:
        if not os.path.isfile(so):
            p.error(f"no library at {so}")
    if args.rounds < 1 or args.tokens < 2 or args.prefill < 0:
        p.error("--rounds must be at least 1, --tokens at least 2 and --prefill at least 0")

    import engine_part
    from core.sampling_params import SamplingParams
    from plugins.cpu_native import library

    calls: list[float] = []  # the current round's decode call times, s
    init = library.NativeLib.__init__

    def timed_init(self, *a, **k) -> None:
        init(self, *a, **k)
        decode = self.decode

        def timed(*call_args):
            start = time.perf_counter()
            status = decode(*call_args)
            calls.append(time.perf_counter() - start)
            return status

        self.decode = timed

    library.NativeLib.__init__ = timed_init
    llms = []
    for so in args.libraries:
        library.library_path = lambda table, so=so: so
        llms.append(engine_part.make_llm(None, "gguf", prefix_caching=False, dtype=args.dtype))
    if args.prefill:
        from core.bench.stats import random_prompts

        vocab = llms[0].engine.loaded.hf_config.vocab_size
        prompt = random_prompts(1, args.prefill, vocab, seed=0)[0]
    else:
        prompt = list(range(1000, 1016))
    max_tokens = 1 if args.prefill else args.tokens + 1

    def run(llm, tag: str) -> tuple[list[float], list[int]]:
        engine, tokens = llm.engine, []
        calls.clear()
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        engine.add_request(tag, params=params, prompt_token_ids=prompt)
        while engine.has_unfinished_requests():
            for out in engine.step():
                tokens = list(out.outputs[0].token_ids)
        return (calls[:1] if args.prefill else calls[1:]), tokens

    for i, llm in enumerate(llms):
        run(llm, f"warm-{i}")
    steps: list[list[float]] = [[], []]
    ratios = []
    for r in range(args.rounds):
        (a, ta), (b, tb) = (run(llm, f"round-{r}-{i}") for i, llm in enumerate(llms))
        if ta != tb:
            raise SystemExit(f"round {r}: the two builds generated different tokens")
        steps[0] += a
        steps[1] += b
        ratios.append(quantile(a, 0.1) / quantile(b, 0.1))
        print(
            f"round {r}: step ms p10 {quantile(a, 0.1) * 1e3:.3f} / {quantile(b, 0.1) * 1e3:.3f}, "
            f"median {statistics.median(a) * 1e3:.3f} / {statistics.median(b) * 1e3:.3f}, "
            f"load {os.getloadavg()[0]:.2f}",
            flush=True,
        )
    for so, xs in zip(args.libraries, steps, strict=True):
        print(f"{so}: step ms p10 {quantile(xs, 0.1) * 1e3:.3f}, median {statistics.median(xs) * 1e3:.3f}, "
              f"min {min(xs) * 1e3:.3f}")  # fmt: skip
    print(f"new / base speed, median of the rounds' p10 ratios: {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
