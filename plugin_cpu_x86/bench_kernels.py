"""Micro-benchmark of the native kernels (not a test): python plugin_cpu_x86/bench_kernels.py

Prints, for the SmolLM2-135M shapes, the quantized matrix-vector kernels (GB/s of
weight bytes streamed and GOP/s; "/i8" = int8 activations, CPU_QUANT_ACTIVATIONS)
against torch float32 F.linear, the prefill path,
and paged attention (decode) against the torch reference.
Set CORE_CPU_KERNEL_ISA to time another path; --threads N to change the thread count.
"""

from __future__ import annotations

import argparse
import time

import gguf
import torch
import torch.nn.functional as F
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.attention import AttentionMetadata
from plugins.kernels import GGUFWeight, Kernels

SHAPES = [(576, 576), (1536, 576), (576, 1536), (49152, 576)]  # (out, in)


CLOCK = time.perf_counter  # main() switches to thread CPU time with --cpu-time


def timeit(fn, min_time: float = 0.3) -> float:
    """Seconds per call: best of 3 rounds of as many calls as fit in min_time / 3."""
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_time / 3:
        fn()
        n += 1
    best = float("inf")
    for _ in range(3):
        start = CLOCK()
        for _ in range(n):
            fn()
        best = min(best, (CLOCK() - start) / n)
    return best


def bench_linear(kern, tokens: int) -> None:
    print(f"\nlinear, {tokens} token(s): time us | GB/s of weights | GOP/s")
    for n, k in SHAPES:
        w = torch.randn(n, k) * 0.05
        line = f"  {n:5d}x{k:<5d}"
        x = torch.randn(tokens, k)
        t = timeit(lambda w=w, x=x: F.linear(x, w))
        line += f" fp32 torch {t * 1e6:8.1f} {n * k * 4 / t / 1e9:6.1f} {2 * tokens * n * k / t / 1e9:6.1f} |"
        for qtype in ("Q4_1", "Q8_0"):
            data = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[qtype]))
            x = torch.randn(tokens, k)
            for int8_act in (False, True):  # default float32 activations, then CPU_QUANT_ACTIVATIONS
                kern.quantize_activations = int8_act  # (decides the weight layout at prepare)
                prepared = kern.prepare_linear(GGUFWeight(qtype, data, n, k), "gguf")
                t = timeit(lambda p=prepared, x=x: kern.linear(x, p))
                name = qtype + ("/i8" if int8_act else "")
                line += f" {name} {t * 1e6:8.1f} {data.numel() / t / 1e9:6.1f} {2 * tokens * n * k / t / 1e9:6.1f} |"
            kern.quantize_activations = False
        print(line)


def bench_attention(kern) -> None:
    ref = Kernels()
    print("\npaged attention decode (9 q heads, 3 kv heads, d 64, block 16): native us | reference us")
    for batch, ctx in ((1, 128), (1, 1024), (8, 512)):
        bs, blocks = 16, -(-ctx // 16)
        tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(batch)]
        meta = AttentionMetadata.build([1] * batch, [ctx] * batch, tables, bs)
        kc, vc = torch.randn(batch * blocks, bs, 3, 64), torch.randn(batch * blocks, bs, 3, 64)
        q = torch.randn(batch, 9, 64)
        args = (q, kc, vc, meta, 0.125)
        t_nat = timeit(lambda args=args: kern.paged_attention(*args))
        t_ref = timeit(lambda args=args: ref.paged_attention(*args))
        print(f"  batch {batch} ctx {ctx:5d}: {t_nat * 1e6:8.1f} | {t_ref * 1e6:8.1f}  ({t_ref / t_nat:.1f}x)")


def bench_small_ops(kern) -> None:
    x, res, w = torch.randn(1, 576), torch.randn(1, 576), torch.randn(576)
    gu = torch.randn(1, 3072)
    print("\nper-call cost at batch 1 (us): rms_norm, fused_add_rms_norm, silu_and_mul")
    print(
        f"  {timeit(lambda: kern.rms_norm(x, w, 1e-5)) * 1e6:.1f}, "
        f"{timeit(lambda: kern.fused_add_rms_norm(x, res, w, 1e-5)) * 1e6:.1f}, "
        f"{timeit(lambda: kern.silu_and_mul(gu)) * 1e6:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--cpu-time", action="store_true", help="time by this thread's CPU time (1 thread; for a loaded machine)"
    )
    args = parser.parse_args()
    if args.cpu_time:
        global CLOCK
        CLOCK, args.threads = time.thread_time, 1
    kern = CpuX86Platform().kernels
    if args.threads:
        kern.num_threads = args.threads
        torch.set_num_threads(args.threads)
    print(f"kernel path {kern.isa}, {kern.num_threads} threads, torch {torch.get_num_threads()} threads")
    bench_linear(kern, 1)
    bench_linear(kern, 4)
    bench_linear(kern, 64)
    bench_attention(kern)
    bench_small_ops(kern)


if __name__ == "__main__":
    main()
