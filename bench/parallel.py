"""Parallel layouts on this machine: the all-reduce's latency, then TP=1 vs TP=2 vs PP=2 (vs DP=2) served.

``allreduce``: two processes, one CPU each, all-reduce one token's hidden state (``--hidden``
floats, the default model's 576) through gloo (the SDK's :class:`plugins.distributed.Communicator`)
and through the platform's communicator (``Platform.make_communicator``: shared memory on the
CPU plugins), in alternating rounds; the median per-call latency of each round and the
median gloo / platform ratio.

``layouts``: a fresh ``core serve`` on the default model (SmolLM2-135M GGUF) per layout and
round, layouts alternating round by round; a warm-up request, then one stream (the median
inter-token latency) and 32 concurrent streams (generated tokens per second); the median over
rounds of each layout's ITL (and 32 streams' tok/s) over TP=1's in the same round. With two
cores: TP=1 binds both to one engine (``auto``), TP=2, PP=2 and DP=2 give each rank one core
(``CORE_CPU_OMP_THREADS_BIND=0|1``). PP=2 runs the default model's 30 layers as two stages of
15, a step's batch cut into two micro-batches that the stages overlap.

Usage: ``python bench/parallel.py [allreduce|layouts|all] [--rounds 3] [--layouts "TP=1,TP=2 (mp),PP=2 (mp)"]
[--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
from serve_part import server  # noqa: E402

LAYOUTS = {
    "TP=1": ([], "auto"),
    "TP=2 (mp)": (["-tp", "2"], "0|1"),
    "TP=2 (ray)": (["-tp", "2", "--distributed-executor-backend", "ray"], "0|1"),
    "PP=2 (mp)": (["-pp", "2"], "0|1"),
    "PP=2 (ray)": (["-pp", "2", "--distributed-executor-backend", "ray"], "0|1"),
    "DP=2": (["-dp", "2"], "0|1"),
}
COMMUNICATORS = ("gloo", "platform")


def _allreduce_rank(kind: str, rank: int, address: str, hidden: int, calls: int, results) -> None:
    """One rank of :func:`allreduce_latency` (module level, so ``spawn`` can start it)."""
    os.sched_setaffinity(0, [rank % os.cpu_count()])
    import torch
    from core.resolve import resolve_platform
    from plugins.distributed import Communicator

    torch.set_num_threads(1)
    if kind == "gloo":
        comm = Communicator("gloo", rank, 2, address)
    else:
        comm = resolve_platform("auto").make_communicator(rank, 2, address)
    x = torch.randn(1, hidden)
    for _ in range(100):  # warm-up
        comm.all_reduce(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        comm.all_reduce(x)
        times.append(time.perf_counter_ns() - start)
    comm.close()
    results.put((rank, type(comm).__name__, statistics.median(times) / 1e3))


def allreduce_latency(kind: str, hidden: int, calls: int) -> tuple[str, float]:
    """The communicator's class and rank 0's median all-reduce latency (us) of ``[1, hidden]`` float32."""
    import multiprocessing

    from plugins.distributed import free_tcp_address

    ctx = multiprocessing.get_context("spawn")
    results, address = ctx.Queue(), free_tcp_address()
    procs = [ctx.Process(target=_allreduce_rank, args=(kind, r, address, hidden, calls, results)) for r in range(2)]
    for p in procs:
        p.start()
    answers = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    return answers[0][1], answers[0][2]


def run_layout(flags: list[str], bind: str, output_len: int, input_len: int) -> dict:
    """One stream's median ITL and 32 streams' tok/s against a fresh server with ``flags``."""
    from core.bench.serve import run_level
    from core.bench.stats import random_prompts

    cmd = [sys.executable, "-m", "core.cli", "serve", "--host", "127.0.0.1", "--port", "{port}", *flags]
    with server(cmd, "core serve " + " ".join(flags), env={**os.environ, "CORE_CPU_OMP_THREADS_BIND": bind}) as url:
        asyncio.run(run_level(url, None, random_prompts(2, 8, 10000, 1), 4, 2, timeout_s=120))  # warm-up
        one = asyncio.run(run_level(url, None, random_prompts(1, input_len, 10000, 2), output_len, 1))
        many = asyncio.run(run_level(url, None, random_prompts(32, input_len, 10000, 3), output_len, 32))
    for level in (one, many):
        if level.num_failed:
            raise RuntimeError(f"{level.num_failed} requests failed: {level.errors}")
    return {
        "itl_ms_p50_1_stream": one.itl_ms["p50"],
        "tok_s_1_stream": one.output_tok_s,
        "itl_ms_p50_32_streams": many.itl_ms["p50"],
        "tok_s_32_streams": many.output_tok_s,
    }


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("allreduce", "layouts", "all"), default="all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--calls", type=int, default=2000, help="all-reduces timed per rank and round")
    parser.add_argument(
        "--layouts", default="TP=1,TP=2 (mp),PP=2 (mp)", help=f"comma-separated, of: {', '.join(LAYOUTS)}"
    )
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results: dict = {"allreduce": [], "layouts": []}
    if args.what in ("allreduce", "all"):
        for i in range(args.rounds):
            rnd = {kind: allreduce_latency(kind, args.hidden, args.calls) for kind in COMMUNICATORS}
            ratio = rnd["gloo"][1] / rnd["platform"][1]
            results["allreduce"].append({**{k: v[1] for k, v in rnd.items()}, "platform_class": rnd["platform"][0]})
            print(
                f"all-reduce [1, {args.hidden}] float32, round {i + 1}: gloo {rnd['gloo'][1]:.1f} us, "
                f"{rnd['platform'][0]} {rnd['platform'][1]:.2f} us: {ratio:.0f}x ({load()})",
                flush=True,
            )
        ratios = [r["gloo"] / r["platform"] for r in results["allreduce"]]
        print(f"all-reduce: gloo / platform median {statistics.median(ratios):.0f}x over {args.rounds} rounds")
    if args.what in ("layouts", "all"):
        names = [n.strip() for n in args.layouts.split(",")]
        unknown = [n for n in names if n not in LAYOUTS]
        if unknown or "TP=1" not in names:
            parser.error(f"--layouts must include TP=1 and name only {', '.join(LAYOUTS)} (got {unknown or names})")
        print(f"{'layout':<11} {'ITL p50 1 stream':>17} {'tok/s 1 stream':>15} {'ITL p50 32':>11} {'tok/s 32':>9}")
        for i in range(args.rounds):
            rnd = {}
            for name in names:
                r = rnd[name] = run_layout(*LAYOUTS[name], args.output_len, args.input_len)
                print(
                    f"{name:<11} {r['itl_ms_p50_1_stream']:>14.1f} ms {r['tok_s_1_stream']:>15.1f} "
                    f"{r['itl_ms_p50_32_streams']:>8.1f} ms {r['tok_s_32_streams']:>9.1f}   round {i + 1}, {load()}",
                    flush=True,
                )
            results["layouts"].append(rnd)
        for name in names[1:]:
            for key, what in (("itl_ms_p50_1_stream", "ITL at 1 stream"), ("tok_s_32_streams", "tok/s at 32 streams")):
                ratios = [r[name][key] / r["TP=1"][key] for r in results["layouts"]]
                each = ", ".join(f"{x:.2f}" for x in ratios)
                print(f"{name} / TP=1 {what}: median {statistics.median(ratios):.2f}x ({each})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
