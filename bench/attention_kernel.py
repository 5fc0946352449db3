"""The CPU paged-attention kernel alone, decode and prefill shapes of the default model.

    python bench/attention_kernel.py [--threads 1] [--isa auto] [--dtype bfloat16]

9 query / 3 KV heads of 64 (SmolLM2-135M), caches (float32 unless `--cache-dtype`: float16, bfloat16,
float8_e5m2) in shuffled blocks of 16, queries and output float32 (``--dtype bfloat16``: bfloat16
queries, output and caches, the ``--dtype bfloat16`` engine's case):
32 decode rows at context 192 and 64, one decode row at 1024, one 128- and one 512-token
prompt. Each case is checked against a torch softmax attention first (max abs error
printed), then timed (best of 20 calls, warm caches), with the FLOP rate
(4 * heads * head size per query-key pair) and the rate K/V rows are read at. ``--layers 30``:
as in a model's forward, each call reads another layer's caches (30 of them, cold in the
caches a step later: the engine's case); the time is a call's, best of 5 passes. Not for CI.
"""

from __future__ import annotations

import argparse
import time

import torch
from plugin_cpu_x86.platform import ISA_TABLE
from plugins.cpu_native.kernels import NativeCpuKernels, cache_code
from plugins.cpu_native.library import DTYPE_BF16, DTYPE_F32

HQ, HK, D, BLOCK = 9, 3, 64, 16
DTYPE_CODES = {torch.float32: DTYPE_F32, torch.bfloat16: DTYPE_BF16}
CASES = ((32, 1, 192), (32, 1, 64), (1, 1, 1024), (1, 128, 128), (1, 512, 512))  # seqs, query tokens, context


def reference(q, k_cache, v_cache, tables, num_seqs, q_len, ctx) -> torch.Tensor:
    outs = []
    for s in range(num_seqs):
        k = k_cache[tables[s].long()].reshape(-1, HK, D)[:ctx].repeat_interleave(HQ // HK, 1)
        v = v_cache[tables[s].long()].reshape(-1, HK, D)[:ctx].repeat_interleave(HQ // HK, 1)
        scores = torch.einsum("qhd,khd->hqk", q[s * q_len : (s + 1) * q_len].reshape(q_len, HQ, D), k) * D**-0.5
        hidden = torch.arange(ctx)[None, :] > (ctx - q_len + torch.arange(q_len))[:, None]
        outs.append(torch.einsum("hqk,khd->qhd", scores.masked_fill(hidden, float("-inf")).softmax(-1), v))
    return torch.cat(outs).reshape(num_seqs * q_len, HQ * D)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--isa", default="auto", help="CPU_KERNEL_ISA")
    p.add_argument("--layers", type=int, default=1, help="caches the calls rotate through")
    p.add_argument("--cache-dtype", default="float32", choices=("float32", "float16", "bfloat16", "float8_e5m2"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="queries and output")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    cache_dtype = dtype if dtype == torch.bfloat16 else getattr(torch, args.cache_dtype)
    code = cache_code(dtype, cache_dtype)
    kernels = NativeCpuKernels(ISA_TABLE, args.isa, num_threads=args.threads)
    torch.manual_seed(0)
    print(
        f"kernels {kernels.isa}, {args.threads} thread(s), {args.layers} layer(s), {args.dtype} queries and output, ",
        end="",
    )
    print(f"{str(cache_dtype).removeprefix('torch.')} caches")
    for num_seqs, q_len, ctx in CASES:
        blocks = -(-ctx // BLOCK)
        shape = (num_seqs * blocks + 8, BLOCK, HK, D)
        caches = [(torch.randn(shape).to(cache_dtype), torch.randn(shape).to(cache_dtype)) for _ in range(args.layers)]
        k_cache, v_cache = caches[0]
        tables = torch.randperm(num_seqs * blocks + 8)[: num_seqs * blocks].to(torch.int32).reshape(num_seqs, blocks)
        starts = (torch.arange(num_seqs + 1) * q_len).to(torch.int32)
        seq_lens = torch.full((num_seqs,), ctx, dtype=torch.int32)
        q = torch.randn(num_seqs * q_len, HQ * D).to(dtype)
        out = torch.empty_like(q)
        calls = [
            (
                DTYPE_CODES[dtype], code, out.data_ptr(), q.data_ptr(), HQ * D, k.data_ptr(), v.data_ptr(),
                1.0, 1.0, starts.data_ptr(), seq_lens.data_ptr(), tables.data_ptr(), blocks, num_seqs * q_len,
                num_seqs, HQ, HK, D, BLOCK, D**-0.5, 0, args.threads,
            )
            for k, v in caches
        ]  # fmt: skip
        kernels.lib.paged_attention(*calls[0])
        ref = reference(q.float(), k_cache.float(), v_cache.float(), tables, num_seqs, q_len, ctx)
        error = (out.float() - ref).abs().max().item()
        best = float("inf")
        for _ in range(20 if args.layers == 1 else 5):
            start = time.perf_counter()
            for call in calls:
                kernels.lib.paged_attention(*call)
            best = min(best, (time.perf_counter() - start) / len(calls))
        flops = 4 * HQ * D * num_seqs * sum(ctx - q_len + i + 1 for i in range(q_len))
        kv_bytes = 2 * num_seqs * ctx * HK * D * k_cache.element_size()
        print(
            f"{num_seqs} seqs x {q_len} query tokens, context {ctx}: {best * 1e6:.0f} us, "
            f"{flops / best / 1e9:.1f} GFLOP/s, K/V {kv_bytes / best / 1e9:.1f} GB/s, max error {error:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
