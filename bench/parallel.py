"""TP=1 vs TP=2 vs DP=2 on this machine: ``core serve`` with each layout, one stream and 32.

Each layout gets a fresh server on the default model (SmolLM2-135M GGUF), a warm-up
request, then one stream (per-token latency: the median inter-token latency) and 32
concurrent streams (generated tokens per second). With two cores: TP=1 binds both to one
engine (``auto``), TP=2 and DP=2 give each rank one core (``CORE_CPU_OMP_THREADS_BIND=0|1``).

Usage: ``python bench/parallel.py [--output-len 64] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from serve_part import _free_port, _wait_healthy, stop  # noqa: E402

LAYOUTS = {
    "TP=1": ([], "auto"),
    "TP=2 (mp)": (["-tp", "2"], "0|1"),
    "TP=2 (ray)": (["-tp", "2", "--distributed-executor-backend", "ray"], "0|1"),
    "DP=2": (["-dp", "2"], "0|1"),
}


def run_layout(flags: list[str], bind: str, output_len: int, input_len: int) -> dict:
    """One stream's median ITL and 32 streams' tok/s against a fresh server with ``flags``."""
    from core.bench.serve import run_level
    from core.bench.stats import random_prompts

    port = _free_port()
    cmd = [sys.executable, "-m", "core.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *flags]
    log = tempfile.TemporaryFile("w+")
    env = {**os.environ, "CORE_CPU_OMP_THREADS_BIND": bind}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, timeout_s=600)
        asyncio.run(run_level(url, None, random_prompts(2, 8, 10000, 1), 4, 2, timeout_s=120))  # warm-up
        one = asyncio.run(run_level(url, None, random_prompts(1, input_len, 10000, 2), output_len, 1))
        many = asyncio.run(run_level(url, None, random_prompts(32, input_len, 10000, 3), output_len, 32))
    finally:
        stop(proc)
    for level in (one, many):
        if level.num_failed:
            log.seek(0)
            raise RuntimeError(f"{level.num_failed} requests failed: {level.errors}; log: {log.read()[-1500:]}")
    return {
        "itl_ms_p50_1_stream": one.itl_ms["p50"],
        "tok_s_1_stream": one.output_tok_s,
        "itl_ms_p50_32_streams": many.itl_ms["p50"],
        "tok_s_32_streams": many.output_tok_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    print(f"{'layout':<11} {'ITL p50 1 stream':>17} {'tok/s 1 stream':>15} {'ITL p50 32':>11} {'tok/s 32':>9}")
    for name, (flags, bind) in LAYOUTS.items():
        r = results[name] = run_layout(flags, bind, args.output_len, args.input_len)
        print(
            f"{name:<11} {r['itl_ms_p50_1_stream']:>14.1f} ms {r['tok_s_1_stream']:>15.1f} "
            f"{r['itl_ms_p50_32_streams']:>8.1f} ms {r['tok_s_32_streams']:>9.1f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
