"""``core bench serve``: streaming clients against a running server's ``/v1/completions``.

Each concurrency level sends ``num_prompts`` requests (default: one per client) with at
most ``concurrency`` in flight, every one ``stream: true`` with ``ignore_eos`` so it
generates exactly ``output_len`` tokens. TTFT is the time to the first chunk with text,
ITL the gaps between later ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

from core.bench.stats import LevelResult, RequestRecord, random_prompts, summarize_level


async def _model_name(client: Any, base_url: str) -> str:
    resp = await client.get(f"{base_url}/v1/models")
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise ValueError(f"{base_url}/v1/models lists no model; pass --model")
    return data[0]["id"]


async def _one_request(client: Any, url: str, body: dict[str, Any]) -> RequestRecord:
    record = RequestRecord(prompt_tokens=len(body["prompt"]))
    start = last = time.perf_counter()
    chunks = 0
    try:
        async with client.stream("POST", url, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                record.error = f"HTTP {resp.status_code}: {text[:200]}"
                return record
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                event = json.loads(payload)
                if event.get("usage"):
                    record.output_tokens = event["usage"].get("completion_tokens", 0)
                    record.prompt_tokens = event["usage"].get("prompt_tokens", record.prompt_tokens)
                if not any(c.get("text") for c in event.get("choices") or []):
                    continue
                now = time.perf_counter()
                if record.ttft is None:
                    record.ttft = now - start
                else:
                    record.itls.append(now - last)
                last = now
                chunks += 1
    except Exception as exc:  # one failed request is reported in the level's errors, not fatal
        record.error = f"{type(exc).__name__}: {exc}"
        return record
    record.latency = time.perf_counter() - start
    record.output_tokens = record.output_tokens or chunks
    return record


async def run_level(
    base_url: str, model: str | None, prompts: Sequence[list[int]], output_len: int, concurrency: int,
    api_key: str | None = None, timeout_s: float = 3600.0,
) -> LevelResult:  # fmt: skip
    """Send every prompt, at most ``concurrency`` at a time; summarize the level."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout_s), limits=limits) as client:
        name = model or await _model_name(client, base_url)
        queue: asyncio.Queue[list[int]] = asyncio.Queue()
        for prompt in prompts:
            queue.put_nowait(prompt)
        records: list[RequestRecord] = []

        async def worker() -> None:
            while not queue.empty():
                prompt = queue.get_nowait()
                body = {
                    "model": name, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
                }  # fmt: skip
                records.append(await _one_request(client, f"{base_url}/v1/completions", body))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
        duration = time.perf_counter() - start
    return summarize_level(concurrency, records, duration)


def run_serve_bench(args: argparse.Namespace) -> list[LevelResult]:
    """Every level of ``args.concurrency`` in turn, after a one-request warm-up."""
    base_url = args.base_url.rstrip("/")
    results = []
    warm = random_prompts(1, min(args.input_len, 8), args.vocab_size, args.seed + 1)
    asyncio.run(run_level(base_url, args.model, warm, 2, 1, args.api_key))
    for level in args.concurrency:
        count = args.num_prompts or level
        prompts = random_prompts(count, args.input_len, args.vocab_size, args.seed + level)
        results.append(asyncio.run(run_level(base_url, args.model, prompts, args.output_len, level, args.api_key)))
    return results


def cmd_serve_bench(args: argparse.Namespace) -> int:
    """Entry point of ``core bench serve``."""
    from core.bench.report import plot_levels, print_levels, write_json

    results = run_serve_bench(args)
    print_levels(results)
    if args.json:
        write_json(args.json, {"mode": "serve", "base_url": args.base_url, "input_len": args.input_len,
                               "output_len": args.output_len, "levels": [r.__dict__ for r in results]})  # fmt: skip
    if args.plot:
        plot_levels(results, args.plot, title=f"core bench serve: {args.input_len} in + {args.output_len} out tokens")
    failed = sum(r.num_failed for r in results)
    return 1 if failed else 0
