"""Compile every shared Triton kernel for NVIDIA or AMD targets, without a GPU.

Runs Triton's whole GPU pipeline for a target: TTIR -> TTGIR -> LLVM -> PTX -> cubin
(bundled ptxas) for a compute capability such as ``90``, or LLVM -> AMDGCN -> hsaco
(Triton's built-in AMDGPU LLVM and lld) for a gfx target such as ``gfx942``; so type
errors, unsupported ops and shared-memory (LDS) overflows show up on a machine with
no GPU. Must run without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``).

    python -m plugins.gpu_triton.compile_check --arch 80 86 90 --dtype bf16 fp16 fp32
    python -m plugins.gpu_triton.compile_check --arch gfx90a gfx942
"""

from __future__ import annotations

import argparse
import os
import sys

#: shared memory one block may use on the smallest part of each generation (bytes);
#: AMD: LDS per workgroup of MI200 (gfx90a) and MI300 (gfx942)
SHARED_LIMIT = {
    "80": 163 * 1024,
    "86": 99 * 1024,
    "89": 99 * 1024,
    "90": 227 * 1024,
    "gfx90a": 64 * 1024,
    "gfx942": 64 * 1024,
}
TORCH_NAME = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def kernel_specs(dtype: str, head_size: int):
    """``(kernel, argument types, constexprs, num_warps)`` as the wrappers launch them on a GPU."""
    import torch
    from plugins.gpu_triton import attention, gemv, ops
    from plugins.gpu_triton.kernels import attention_tiles

    ptr = f"*{dtype}"
    block_m, block_n = attention_tiles(getattr(torch, TORCH_NAME[dtype]), head_size)
    block_d = max(16, 1 << (head_size - 1).bit_length())
    attn = {"q_ptr": ptr, "k_cache": ptr, "v_cache": ptr, "out_ptr": ptr, "block_tables": "*i32",
            "query_start_loc": "*i32", "seq_lens": "*i32", "part_acc": "*fp32", "part_ml": "*fp32", "qk_scale": "fp32"}  # fmt: skip
    yield (
        attention._prefill_kernel,
        attn,
        dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d),
        4,
    )
    for single in (True, False):
        consts = dict(BLOCK_G=16, BLOCK_N=block_n, BLOCK_D=block_d, SINGLE_SPLIT=single)
        yield attention._decode_kernel, attn, consts, 4
    yield attention._reduce_kernel, attn, dict(BLOCK_S=32, BLOCK_D=block_d), 4
    norm = {"x_ptr": ptr, "res_ptr": ptr, "sum_ptr": ptr, "w_ptr": ptr, "out_ptr": ptr, "eps": "fp32"}
    yield ops._rms_norm_kernel, norm, dict(HAS_RESIDUAL=True, BLOCK=4096), 8
    yield ops._silu_and_mul_kernel, {"x_ptr": ptr, "out_ptr": ptr}, dict(BLOCK=1024), 4
    rotary = {"pos_ptr": "*i64", "cache_ptr": "*fp32", "q_ptr": ptr, "q_out_ptr": ptr, "k_ptr": ptr, "k_out_ptr": ptr}
    yield ops._rotary_kernel, rotary, dict(BLOCK_H=32, BLOCK_HALF=block_d // 2), 4
    kv = {"k_ptr": ptr, "v_ptr": ptr, "kc_ptr": ptr, "vc_ptr": ptr, "slot_ptr": "*i64"}
    yield ops._write_kv_kernel, kv, dict(BLOCK_H=8, BLOCK_D=block_d), 4
    skinny = {"x_ptr": ptr, "w_ptr": ptr, "b_ptr": ptr, "out_ptr": ptr}
    for block_n, block_k, warps in gemv.CONFIGS:
        for rows in (1, 2, 4, 8):
            if rows * block_n * block_k <= gemv.MAX_TILE:
                consts = dict(HAS_BIAS=True, M_PAD=rows, BLOCK_N=block_n, BLOCK_K=block_k)
                yield gemv._skinny_kernel, skinny, consts, warps
    bitmask = {"logits_ptr": "*fp32", "bitmask_ptr": "*i32", "rows_ptr": "*i64"}
    yield ops._token_bitmask_kernel, bitmask, dict(BLOCK=1024), 4


def gpu_target(arch: str):
    """Triton's target for ``"90"`` (NVIDIA sm_90, 32-wide warps) or ``"gfx942"`` (AMD, 64-wide wavefronts)."""
    from triton.backends.compiler import GPUTarget

    return GPUTarget("hip", arch, 64) if arch.startswith("gfx") else GPUTarget("cuda", int(arch), 32)


def compile_all(archs: list[str], dtypes: list[str], head_sizes: list[int]) -> list[str]:
    """Compile every kernel; return one line per failure (empty: all compiled and fit)."""
    import triton
    from triton.compiler import ASTSource

    failures = []
    for arch in archs:
        for dtype in dtypes:
            for head_size in head_sizes:
                for fn, types, consts, warps in kernel_specs(dtype, head_size):
                    names = fn.arg_names
                    signature = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
                    src = ASTSource(fn, signature, constexprs={(names.index(k),): v for k, v in consts.items()})
                    name = arch if arch.startswith("gfx") else f"sm_{arch}"
                    what = f"{fn.__name__} {name} {dtype} head_size={head_size}"
                    try:
                        compiled = triton.compile(src, target=gpu_target(arch), options={"num_warps": warps})
                    except Exception as exc:  # report every kernel, not just the first
                        failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:400]}")
                        continue
                    shared = compiled.metadata.shared
                    if shared > SHARED_LIMIT.get(arch, 99 * 1024):
                        failures.append(f"{what}: needs {shared} B shared memory, {name} has {SHARED_LIMIT[arch]}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", default=["80", "86", "90"], help="compute capabilities or gfx targets")
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp16", "fp32"], choices=sorted(TORCH_NAME))
    parser.add_argument("--head-size", type=int, nargs="+", default=[128])
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU", file=sys.stderr)
        return 2
    failures = compile_all(args.arch, args.dtype, args.head_size)
    for line in failures:
        print("FAIL", line)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
