"""The CPU linear kernels alone, per activation path, on weights that do not fit the caches.

    python bench/linear_kernels.py [--formats Q4_0,Q4_1,Q8_0] [--rows 1,8,32,128] [--threads 1] [--isa auto]

For each GGUF format and weight shape of the default model's layers (1536 x 576, 576 x 1536),
``--weights`` distinct random weights (64 x ~0.5 MB: past the L3 cache, as in a decode step) are
multiplied by ``rows`` activation rows through ``lib.linear``, best of 5 passes, microseconds a
product, in three ways: float32 activations on the blocks as stored (``float``), int16
activations per block of 32 on the x8 layout (``int16``: the default path,
``CK_ACT16``), int8 ones (``int8``: ``CORE_CPU_QUANT_ACTIVATIONS=1``). On builds without
AVX-512, ``int16`` runs the float32 panel kernel from 7 rows (64 on Q4_0/Q4_1). Not for CI.
"""

from __future__ import annotations

import argparse
import time

import gguf
import torch
from plugin_cpu_x86.platform import ISA_TABLE
from plugins.cpu_native.kernels import NativeCpuKernels
from plugins.cpu_native.library import ACT16, DTYPE_F32
from plugins.cpu_native.linear import gguf_weight
from plugins.kernels import GGUFWeight

SHAPES = ((1536, 576), (576, 1536))


def random_weight(fmt: str, n: int, k: int):
    codes = gguf.quants.quantize(torch.randn(n, k).numpy(), gguf.GGMLQuantizationType[fmt])
    return gguf_weight(GGUFWeight(fmt, torch.from_numpy(codes.reshape(n, -1)), n, k))


def time_us(kernels: NativeCpuKernels, weights, code_of, rows: int, threads: int) -> float:
    n, k = weights[0].out_features, weights[0].in_features
    x, out = torch.randn(rows, k), torch.empty(rows, n)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for w in weights:
            kernels.lib.linear(code_of(w), w.data_ptr, None, n, k, DTYPE_F32, x.data_ptr(), k, rows, out.data_ptr(),
                               None, DTYPE_F32, threads)  # fmt: skip
        best = min(best, (time.perf_counter() - start) / len(weights))
    return best * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--formats", default="Q4_0,Q4_1,Q8_0")
    p.add_argument("--rows", default="1,8,32,128")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--isa", default="auto", help="CPU_KERNEL_ISA")
    p.add_argument("--weights", type=int, default=64)
    args = p.parse_args()
    kernels = NativeCpuKernels(ISA_TABLE, args.isa, num_threads=args.threads)
    print(f"kernels {kernels.isa}, {args.threads} thread(s); microseconds a product (best of 5)")
    print("| format | weight | rows | float | int16 (default) | int8 | float / int16 |")
    print("|---|---|---|---|---|---|---|")
    for fmt in args.formats.split(","):
        for n, k in SHAPES:
            stored = [random_weight(fmt, n, k) for _ in range(args.weights)]
            x8 = [w.to_x8() for w in stored]
            for rows in map(int, args.rows.split(",")):
                plain = time_us(kernels, stored, lambda w: w.code, rows, args.threads)
                act16 = time_us(kernels, x8, lambda w: w.code + ACT16, rows, args.threads)
                int8 = time_us(kernels, x8, lambda w: w.code, rows, args.threads)
                print(f"| {fmt} | {n}x{k} | {rows} | {plain:.1f} | {act16:.1f} | {int8:.1f} | {plain / act16:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
