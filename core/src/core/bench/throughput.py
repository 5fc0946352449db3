"""``core bench throughput``: offline generation with :class:`core.LLM` on random token prompts."""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from core.bench.stats import random_prompts


@dataclass
class ThroughputResult:
    """One offline run: ``num_prompts`` x (``input_len`` prompt + ``output_len`` generated) tokens."""

    num_prompts: int
    input_len: int
    output_len: int
    elapsed_s: float
    prompt_tokens: int
    output_tokens: int
    requests_s: float
    output_tok_s: float
    total_tok_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def vocab_of(llm: Any) -> tuple[int, list[int]]:
    """``(vocab size, special token ids)`` of an :class:`core.LLM`'s model."""
    tokenizer = llm.get_tokenizer()
    vocab = getattr(llm.engine.loaded.hf_config, "vocab_size", None)
    if vocab is None and tokenizer is not None:
        vocab = len(tokenizer)
    if vocab is None:
        raise ValueError("cannot tell the model's vocabulary size: neither hf_config.vocab_size nor a tokenizer")
    if tokenizer is not None:
        vocab = min(vocab, len(tokenizer))  # ids past the tokenizer's table cannot be detokenized
    special = list(getattr(tokenizer, "all_special_ids", []) or [])
    return int(vocab), special


def run_throughput(llm: Any, num_prompts: int, input_len: int, output_len: int, seed: int = 0) -> ThroughputResult:
    """Generate ``output_len`` tokens (``ignore_eos``, greedy) for ``num_prompts`` random prompts.

    A two-token warm-up request runs first and is not timed.
    """
    from core.sampling_params import SamplingParams

    vocab, special = vocab_of(llm)
    prompts = random_prompts(num_prompts, input_len, vocab, seed, exclude=special)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    llm.generate(
        prompt_token_ids=prompts[:1],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True),
        use_tqdm=False,
    )
    start = time.perf_counter()
    outputs = llm.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    out_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    in_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    return ThroughputResult(
        num_prompts=num_prompts,
        input_len=input_len,
        output_len=output_len,
        elapsed_s=elapsed,
        prompt_tokens=in_tokens,
        output_tokens=out_tokens,
        requests_s=num_prompts / elapsed,
        output_tok_s=out_tokens / elapsed,
        total_tok_s=(out_tokens + in_tokens) / elapsed,
    )


def cmd_throughput(args: argparse.Namespace) -> int:
    """Entry point of ``core bench throughput``."""
    from core.bench.report import print_table, write_json
    from core.config import config_from_args
    from core.llm import LLM

    config = config_from_args(args)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in ("model", "device")}
    llm = LLM(config.model, device=config.device, skip_tokenizer_init=args.skip_tokenizer_init, **fields)
    result = run_throughput(llm, args.num_prompts, args.input_len, args.output_len, args.seed)
    print_table(
        ["PROMPTS", "IN", "OUT", "ELAPSED s", "REQ/s", "OUTPUT tok/s", "TOTAL tok/s"],
        [[result.num_prompts, result.input_len, result.output_len, f"{result.elapsed_s:.2f}", f"{result.requests_s:.2f}",
          f"{result.output_tok_s:.1f}", f"{result.total_tok_s:.1f}"]],
    )  # fmt: skip
    if args.json:
        write_json(
            args.json, {"mode": "throughput", "model": config.model, "config": fields, "result": result.as_dict()}
        )
    return 0
