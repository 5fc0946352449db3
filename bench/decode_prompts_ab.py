"""Batch-1 decode of one engine on two prompts, alternating in one process (issue 47's bench gap).

    python bench/decode_prompts_ab.py [--rounds 8] [--tokens 128] [--model FILE]

``bench/decode_vs_llamacpp.py`` timed the default engine's decode after the prompt ``100..115``
and ``bench/cpu_vs_baselines.py`` after 8 random ids; on a quiet machine they read 281 and
225-238 tok/s. This runs both prompts (and ``engine_part.decode_prompt``, the one every bench now
uses) on ONE engine, alternating the order each round, timing each with
``engine_part.decode_tok_s``; it prints each prompt's median and the median per-round ratio to
the fixed run, with the load and how much of the process is in transparent huge pages. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128, help="tokens timed in each decode")
    parser.add_argument("--model", default=None, help="GGUF file (default: the default model)")
    a = parser.parse_args()
    import engine_part
    from core.bench.stats import random_prompts
    from core.bench.throughput import vocab_of

    llm = engine_part.make_llm(a.model, "gguf", prefix_caching=False)
    vocab = vocab_of(llm)[0]
    prompts = {
        "fixed 100..115": list(range(100, 116)),
        "8 random ids (old cpu_vs_baselines)": random_prompts(1, 8, vocab, 0)[0],
        "decode_prompt (16 random ids)": engine_part.decode_prompt(vocab),
    }
    rates: dict[str, list[float]] = {name: [] for name in prompts}
    load = [os.getloadavg()[0]]
    for r in range(a.rounds):
        order = list(prompts) if r % 2 == 0 else list(reversed(prompts))
        for name in order:
            rates[name].append(engine_part.decode_tok_s(llm, prompts[name], a.tokens))
        print(f"round {r}: " + ", ".join(f"{rates[n][-1]:.1f}" for n in prompts), file=sys.stderr, flush=True)
    load.append(os.getloadavg()[0])
    fixed = rates["fixed 100..115"]
    summary = {
        name: {
            "median_tok_s": statistics.median(v),
            "median_ratio_to_fixed": statistics.median(x / f for x, f in zip(v, fixed, strict=True)),
        }
        for name, v in rates.items()
    }
    summary["load_1min_before_after"] = load
    summary["memory_pages"] = engine_part.memory_pages()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
