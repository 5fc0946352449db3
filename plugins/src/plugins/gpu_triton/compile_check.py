"""Compile every shared Triton kernel for NVIDIA, AMD or Intel targets, without a GPU.

Runs Triton's whole GPU pipeline for a target: TTIR -> TTGIR -> LLVM -> PTX -> cubin
(bundled ptxas) for a compute capability such as ``90``; LLVM -> AMDGCN -> hsaco
(Triton's built-in AMDGPU LLVM and lld) for a gfx target such as ``gfx942``; LLVM ->
SPIR-V for an Intel GPU (``pvc``, ``dg2``: needs Intel's Triton, ``triton-xpu``, whose
TTGIR passes lay ``tl.dot`` out on the part's DPAS units and 2D block loads). So type
errors, unsupported ops and shared-memory (LDS, SLM) overflows show up on a machine with
no GPU. Must run without ``TRITON_INTERPRET`` (the interpreter replaces ``@triton.jit``).

    python -m plugins.gpu_triton.compile_check --arch 80 86 90 --dtype bf16 fp16 fp32
    python -m plugins.gpu_triton.compile_check --arch gfx90a gfx942
    python -m plugins.gpu_triton.compile_check --arch pvc dg2     # scripts/test-xpu-compile.sh
"""

from __future__ import annotations

import argparse
import os
import sys

#: shared memory one block may use on the smallest part of each generation (bytes);
#: AMD: LDS per workgroup of MI200 (gfx90a) and MI300 (gfx942); Intel: shared local memory
#: per work-group of the Data Center GPU Max (pvc) and Arc A-series (dg2)
SHARED_LIMIT = {
    "80": 163 * 1024,
    "86": 99 * 1024,
    "89": 99 * 1024,
    "90": 227 * 1024,
    "gfx90a": 64 * 1024,
    "gfx942": 64 * 1024,
    "pvc": 128 * 1024,
    "dg2": 64 * 1024,
}
#: Intel GPU targets: the device properties Intel's Triton reads from ``torch.xpu`` on a device
#: (``architecture`` is SYCL's ``ext::oneapi::experimental::architecture`` value). The Data
#: Center GPU Max (Ponte Vecchio) has 16-wide DPAS and 2D block loads; Arc A-series (Alchemist,
#: DG2) has 8-wide DPAS, no 2D block loads and no fp64
XPU_TARGETS = {
    "pvc": {"architecture": 0x030F000700, "name": "Intel(R) Data Center GPU Max 1550", "max_work_group_size": 1024,
            "max_num_sub_groups": 64, "sub_group_sizes": [16, 32], "has_fp64": True,
            "has_subgroup_matrix_multiply_accumulate": True,
            "has_subgroup_matrix_multiply_accumulate_tensor_float32": True,
            "has_subgroup_2d_block_io": True, "has_bfloat16_conversions": True},
    "dg2": {"architecture": 0x030DC00800, "name": "Intel(R) Arc(TM) A770 Graphics", "max_work_group_size": 1024,
            "max_num_sub_groups": 128, "sub_group_sizes": [8, 16, 32], "has_fp64": False,
            "has_subgroup_matrix_multiply_accumulate": True,
            "has_subgroup_matrix_multiply_accumulate_tensor_float32": False,
            "has_subgroup_2d_block_io": False, "has_bfloat16_conversions": True},
}  # fmt: skip
TORCH_NAME = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def kernel_specs(dtype: str, head_size: int):
    """``(kernel, argument types, constexprs, num_warps)`` as the wrappers launch them on a GPU."""
    import torch
    from plugins.gpu_triton import attention, gemv, moe, ops
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
        for rows in (1, 2, 4):
            if rows * block_n * block_k <= gemv.MAX_TILE:
                consts = dict(HAS_BIAS=True, M_PAD=rows, BLOCK_N=block_n, BLOCK_K=block_k)
                yield gemv._skinny_kernel, skinny, consts, warps
    bitmask = {"logits_ptr": "*fp32", "bitmask_ptr": "*i32", "rows_ptr": "*i64"}
    yield ops._token_bitmask_kernel, bitmask, dict(BLOCK=1024), 4
    grouped = {"a_ptr": ptr, "w_ptr": ptr, "sorted_ids_ptr": "*i32", "block_experts_ptr": "*i32",
               "num_padded_ptr": "*i32", "weights_ptr": "*fp32"}  # fmt: skip
    size = torch.finfo(getattr(torch, TORCH_NAME[dtype])).bits // 8
    for block_m, block_n, block_k, warps in (moe.SMALL_TILES[size], moe.LARGE_TILES[size]):
        tile = dict(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
        # gate/up writes the activations' dtype, down float32 rows
        yield moe._grouped_gemm_kernel, grouped | {"out_ptr": ptr}, dict(GATED=True, **tile), warps
        yield moe._grouped_gemm_kernel, grouped | {"out_ptr": "*fp32"}, dict(GATED=False, **tile), warps


def gpu_target(arch: str):
    """Triton's target for ``"90"`` (NVIDIA sm_90, 32-wide warps), ``"gfx942"`` (AMD, 64-wide
    wavefronts) or a name of :data:`XPU_TARGETS` (Intel, 32-wide sub-groups as Intel's Triton
    uses by default).

    :raises ValueError: for a name that is none of these.
    """
    from triton.backends.compiler import GPUTarget

    if arch in XPU_TARGETS:
        return GPUTarget("xpu", XPU_TARGETS[arch], 32)
    if arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    if not arch.isdigit():
        raise ValueError(
            f"unknown target {arch!r}: a compute capability (90), a gfx target or one of {sorted(XPU_TARGETS)}"
        )
    return GPUTarget("cuda", int(arch), 32)


def target_name(arch: str) -> str:
    """``sm_90`` for a compute capability, else the name as given."""
    return f"sm_{arch}" if arch.isdigit() else arch


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
                    name = target_name(arch)
                    what = f"{fn.__name__} {name} {dtype} head_size={head_size}"
                    try:
                        compiled = triton.compile(src, target=gpu_target(arch), options={"num_warps": warps})
                    except Exception as exc:  # report every kernel, not just the first
                        failures.append(f"{what}: {type(exc).__name__}: {str(exc)[:400]}")
                        continue
                    shared, limit = compiled.metadata.shared, SHARED_LIMIT.get(arch, 99 * 1024)
                    if shared > limit:
                        failures.append(f"{what}: needs {shared} B shared memory, {name} has {limit}")
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--arch",
        nargs="+",
        default=["80", "86", "90"],
        help=f"compute capabilities, gfx targets or {', '.join(XPU_TARGETS)}",
    )
    parser.add_argument("--dtype", nargs="+", default=["bf16", "fp16", "fp32"], choices=sorted(TORCH_NAME))
    parser.add_argument("--head-size", type=int, nargs="+", default=[128])
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU", file=sys.stderr)
        return 2
    total = len(args.arch) * sum(len(list(kernel_specs(d, h))) for d in args.dtype for h in args.head_size)
    failures = compile_all(args.arch, args.dtype, args.head_size)
    for line in failures:
        print("FAIL", line)
    print(
        f"{total - len(failures)} of {total} kernel variants compiled for {' '.join(map(target_name, args.arch))}; {len(failures)} failures"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
