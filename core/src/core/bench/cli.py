"""Argument parsing of ``core bench throughput`` and ``core bench serve``."""

from __future__ import annotations

import argparse
import os


def concurrency_list(text: str) -> list[int]:
    """Parse ``"1,8,32"`` into ``[1, 8, 32]``; every level must be a positive integer."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency must be comma-separated integers like 1,8,32, got {text!r}"
        ) from None
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"--concurrency levels must be positive integers, got {text!r}")
    return levels


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def add_bench_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``bench`` with its ``throughput`` and ``serve`` modes to ``core``'s subcommands."""
    from core.bench.serve import cmd_serve_bench
    from core.bench.throughput import cmd_throughput
    from core.config import add_engine_args

    bench = subparsers.add_parser("bench", help="benchmarks: offline throughput, online serving")
    modes = bench.add_subparsers(dest="bench_mode", required=True)

    tp = modes.add_parser("throughput", help="offline generation with core.LLM on random token prompts")
    add_engine_args(tp)
    tp.add_argument("--num-prompts", type=_positive, default=32)
    tp.add_argument("--input-len", type=_positive, default=128, help="prompt tokens per request")
    tp.add_argument("--output-len", type=_positive, default=128, help="generated tokens per request (ignore_eos)")
    tp.add_argument("--skip-tokenizer-init", action="store_true", help="run without a tokenizer (ids only)")
    tp.add_argument("--json", default=None, metavar="PATH", help="also write the result as JSON")
    tp.set_defaults(func=cmd_throughput)
    (budget,) = (action for action in tp._actions if action.dest == "max_num_batched_tokens")
    # offline no request waits on a step: the big budget, not the platform's latency default
    budget.default, budget.help = 2048, "most new tokens per engine step (default: 2048)"

    sv = modes.add_parser("serve", help="streaming clients against a running server's /v1/completions")
    sv.add_argument("--base-url", default="http://127.0.0.1:8000")
    sv.add_argument("--model", default=None, help="model name to request (default: the first of /v1/models)")
    sv.add_argument("--api-key", default=os.environ.get("CORE_API_KEY"))
    sv.add_argument("--concurrency", type=concurrency_list, default=[1, 8, 32], help="levels, e.g. 1,8,32")
    sv.add_argument("--num-prompts", type=_positive, default=None, help="requests per level (default: the level)")
    sv.add_argument("--input-len", type=_positive, default=128)
    sv.add_argument("--output-len", type=_positive, default=128)
    sv.add_argument("--vocab-size", type=_positive, default=10000, help="prompt token ids are drawn below this")
    sv.add_argument("--seed", type=int, default=0)
    sv.add_argument("--json", default=None, metavar="PATH")
    sv.add_argument("--plot", default=None, metavar="PATH.png", help="output tok/s vs concurrency (needs matplotlib)")
    sv.set_defaults(func=cmd_serve_bench)
    return bench
