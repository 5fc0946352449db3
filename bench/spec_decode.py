"""Batch-1 greedy decode with and without n-gram speculative decoding, on the default model.

    python bench/spec_decode.py [--tokens 128] [--k 4] [--repeats 3]

Two workloads: copy-heavy (the model repeats a given text) and plain chat (a short poem).
Each engine generates the same greedy tokens (checked); printed: tokens/s (best of
``--repeats``), the speed-up, and the share of draft tokens accepted. Not for CI.
"""

from __future__ import annotations

import argparse
import time

from core import LLM, SamplingParams

TEXT = (
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n    middle = len(items) // 2\n"
    "    left = merge_sort(items[:middle])\n    right = merge_sort(items[middle:])\n    merged = []\n"
    "    while left and right:\n        merged.append(left.pop(0) if left[0] <= right[0] else right.pop(0))\n"
    "    return merged + left + right\n"
)
WORKLOADS = {
    "copy-heavy": [{"role": "user", "content": f"Repeat this code exactly, with no comment:\n\n{TEXT}"}],
    "plain chat": [{"role": "user", "content": "Write a short poem about the sea."}],
}


def run(llm: LLM, messages: list[dict], params: SamplingParams, repeats: int) -> tuple[float, list[int]]:
    best, tokens = 0.0, []
    for _ in range(repeats):
        started = time.perf_counter()
        out = llm.chat([messages], params, use_tqdm=False)[0].outputs[0]
        best = max(best, len(out.token_ids) / (time.perf_counter() - started))
        tokens = out.token_ids
    return best, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--lookup-max", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 1}
    ngram["prompt_lookup_max"] = args.lookup_max
    engines = {"off": LLM(max_model_len=1024, max_num_seqs=1), "ngram": LLM(max_model_len=1024, max_num_seqs=1,
                                                                             speculative_config=ngram)}  # fmt: skip
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens)
    print(f"batch 1, greedy, up to {args.tokens} tokens; n-gram k={args.k}, lookup 1..{args.lookup_max}")
    print(f"{'workload':<12} {'tokens':>6} {'off tok/s':>10} {'ngram tok/s':>12} {'speed-up':>9} {'accepted':>9}")
    for name, messages in WORKLOADS.items():
        spec = engines["ngram"].engine.spec
        before = (spec.num_draft_tokens, spec.num_accepted_tokens)
        off, want = run(engines["off"], messages, params, args.repeats)
        on, got = run(engines["ngram"], messages, params, args.repeats)
        if got != want:
            raise SystemExit(f"{name}: speculative tokens differ from the plain run's")
        drafted, accepted = spec.num_draft_tokens - before[0], spec.num_accepted_tokens - before[1]
        rate = f"{100 * accepted / drafted:.0f}%" if drafted else "-"
        print(f"{name:<12} {len(want):>6} {off:>10.1f} {on:>12.1f} {on / off:>8.2f}x {rate:>9}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
