"""Load a CPU plugin's kernel library (native/, the C ABI of the three CPU plugins) through ctypes.

Each plugin builds the same sources into its own library (``plugin_cpu_x86._cx86``,
``plugin_cpu_arm._carm``, ``plugin_s390x._cs390x``: native/cpu_kernels.cmake), which exports
every kernel once per ISA variant of its processor as ``ck_<isa>_<kernel>``, plus
``ck_cpu_features()`` (cpuid on x86, hwcaps on aarch64 and s390x). An :class:`IsaTable`
names a plugin's library, its feature bits and variants; :class:`NativeLib` binds the
functions of one variant with their argtypes once, so a kernel call is a single ctypes
call on integer data pointers.
"""

from __future__ import annotations

import ctypes
import importlib.util
from ctypes import c_float, c_int, c_long, c_void_p
from dataclasses import dataclass

from plugins.errors import PlatformUnavailable

DTYPE_F32, DTYPE_BF16 = 0, 1
#: a float16 KV cache (native/src/common.h's CK_F16): a cache dtype, not a compute one
DTYPE_F16 = 4
Q8_0, Q4_0, Q4_1, INT8, F32W = 0, 1, 2, 3, 4
#: GGUF K-quants (native/src/blocks.h), with int8 activations repacked as float-scaled x8 blocks
Q4_K, Q5_K, Q6_K = 5, 6, 7
#: a format repacked in groups of 8 rows (native/src/quant.cpp, int8 activations): its code + X8
X8 = 8
#: GGUF 5-bit blocks of 32 (what K-quant mixes use where a row is not whole super-blocks):
#: float32-activation kernels only, never repacked
Q5_0, Q5_1 = 12, 13
#: float8 E4M3 weight codes with a float32 scale per row (FP8 checkpoints): float32 activations
E4M3W = 14
#: x8 codes of blocks of 32 with float32 scales, what Q4_K (4-bit codes), Q5_0/Q5_1/Q5_K (byte
#: codes) and Q6_K (signed byte codes, a scale per 16) become for int8 activations
Q4FX8, U8FX8, S8FX8 = 15, 16, 17
#: added to an x8 code at the call: activations rounded to int8 per row, not per block of 32
PER_TOKEN = 64
#: added to an x8 code at the call: the default path, activations rounded to int16 per block of 32
#: (float32 ones from 7 rows on builds without AVX-512)
ACT16 = 128


@dataclass(frozen=True)
class IsaTable:
    """What a CPU plugin's kernel library holds (mirrors native/src/features_<arch>.cpp).

    :param module: the library as an extension module name, e.g. ``"plugin_cpu_arm._carm"``.
    :param feature_bits: names of ``ck_cpu_features()``'s bits, bit 0 first.
    :param requirements: the library's variants, best first, with the features each needs.
    :param choices: ``CPU_KERNEL_ISA`` values -> the variants each may pick, best first
        (``auto`` is every variant).
    """

    module: str
    feature_bits: tuple[str, ...]
    requirements: dict[str, tuple[str, ...]]
    choices: dict[str, tuple[str, ...]]

    @property
    def plugin(self) -> str:
        """The plugin's package name (``plugin_cpu_arm``)."""
        return self.module.split(".")[0]


_P = c_void_p
_SIGNATURES = {
    # dtype, w_dtype, out, res_out, x, x_stride, res, res_stride, w, rows, n, eps, nthreads
    "rms_norm": (None, [c_int, c_int, _P, _P, _P, c_long, _P, c_long, _P, c_long, c_long, c_float, c_int]),
    # dtype, cache_dtype, out, x, row_stride, heads, d, pos, cache, rows, nthreads
    "rotary": (None, [c_int, c_int, _P, _P, c_long, c_long, c_long, _P, _P, c_long, c_int]),
    # dtype, out, x, x_stride, rows, inter, nthreads
    "silu_and_mul": (None, [c_int, _P, _P, c_long, c_long, c_long, c_int]),
    # k, k_stride_bytes, v, v_stride_bytes, k_cache, v_cache, slots, tokens, row_bytes, num_slots
    "write_kv_cache": (c_long, [_P, c_long, _P, c_long, _P, _P, _P, c_long, c_long, c_long]),
    "apply_token_bitmask": (None, [_P, c_long, _P, c_long, _P, c_long, c_long]),
    # dtype, cache_dtype, k, k_stride, v, v_stride, k_cache, v_cache, slots, tokens, row,
    # num_slots, k_scale, v_scale (strides and row in elements; native/src/attention.cpp)
    "write_kv_cache_cast": (
        c_long,
        [c_int, c_int, _P, c_long, _P, c_long, _P, _P, _P, c_long, c_long, c_long, c_float, c_float],
    ),
    # dtype, cache_dtype, out, q, q_stride, k_cache, v_cache, k_scale, v_scale, starts,
    # seq_lens, tables, table_stride, tokens, num_seqs, hq, hk, d, block_size, scale,
    # window (0: none), nthreads; returns -1 for a (dtype, cache_dtype) pair it does not read
    "paged_attention": (
        c_int,
        [
            c_int,
            c_int,
            _P,
            _P,
            c_long,
            _P,
            _P,
            c_float,
            c_float,
            _P,
            _P,
            _P,
            c_long,
            c_long,
            c_long,
            c_long,
            c_long,
            c_long,
            c_long,
            c_float,
            c_long,
            c_int,
        ],
    ),  # fmt: skip
    "attention_max_head": (c_long, []),
    "attention_max_group": (c_long, []),
    "x8_vectorized": (c_int, []),
    # qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias, bias_dtype, nthreads
    # (native/src/quant.cpp: int8 activations for the x8 formats, float32 ones for the others)
    "linear": (c_int, [c_int, _P, _P, c_long, c_long, c_int, _P, c_long, c_long, _P, _P, c_int, c_int]),
    # dtype, out, q, q_stride, k, k_stride, v, v_stride, starts, num_seqs, hq, hk, d, scale, nthreads
    # (native/src/encoder.cpp: bidirectional attention within each sequence)
    "encoder_attention": (
        c_int,
        [c_int, _P, _P, c_long, _P, c_long, _P, c_long, _P, c_long, c_long, c_long, c_long, c_float, c_int],
    ),
    # packed w, n, k, dtype, x, x_stride, rows, out, bias, bias_dtype, act, nthreads
    # (native/src/encoder.cpp; plugins/cpu_native/bf16.py packs w)
    "linear_bf16w": (c_int, [_P, c_long, c_long, c_int, _P, c_long, c_long, _P, _P, c_int, c_int, c_int]),
    # packed gate_up w (2 * inter rows), inter, k, x (bfloat16), x_stride, rows, out, bias, bias_dtype,
    # nthreads: SiLU(gate) * up in one pass (native/src/encoder.cpp; native/src/decode.cpp calls it)
    "linear_bf16w_silu_mul": (c_int, [_P, c_long, c_long, _P, c_long, c_long, _P, _P, c_int, c_int]),
    "linear_bf16w_ready": (c_int, []),
    "bf16_panel_min_rows": (c_int, []),
    # dtype, x, x_stride, rows, a, r_total, in, row_slots, h, nthreads (native/src/lora.cpp)
    "lora_shrink": (c_int, [c_int, _P, c_long, c_long, _P, c_long, c_long, _P, _P, c_int]),
    # dtype, y, y_stride, h, h_stride, b, n, rank, row_slots, rows, num_slots, nthreads
    "lora_expand": (c_int, [c_int, _P, c_long, _P, c_long, _P, c_long, c_long, _P, c_long, c_long, c_int]),
    "lora_max_rank": (c_long, []),
    # experts, dtype, x, x_stride, tokens, topk_weights, topk_ids, top_k, out, nthreads
    # (native/src/moe.cpp; structures in moe.py)
    "fused_moe": (c_int, [_P, c_int, _P, c_long, c_long, _P, _P, c_long, _P, c_int]),
    # decoder, step, nthreads (native/src/decode.cpp; structures in runner.py)
    "decode": (c_int, [_P, _P, c_int]),
}


def library_path(table: IsaTable) -> str:
    """Path of the plugin's built kernel library, found like an extension module (works editable).

    :raises PlatformUnavailable: the plugin was installed without it (built on another processor).
    """
    spec = importlib.util.find_spec(table.module)
    if spec is None or not spec.origin:
        name = table.module.split(".")[1]
        raise PlatformUnavailable(
            f"{table.plugin}'s native library {name}.so is missing: reinstall with `pip install ./{table.plugin}` "
            "on the plugin's processor (needs a C++17 compiler, CMake and OpenMP)"
        )
    return spec.origin


def load_library(table: IsaTable) -> ctypes.CDLL:
    """Open the kernel library (torch first, so its OpenMP runtime is the one shared; a
    process without torch, e.g. scripts/s390x_byteorder.py on s390x, uses the library's own)."""
    if importlib.util.find_spec("torch") is not None:
        import torch  # noqa: F401  (loads torch's libgomp; ours then resolves to the same runtime)

    return ctypes.CDLL(library_path(table))


def cpu_features(table: IsaTable, lib: ctypes.CDLL) -> list[str]:
    """The CPU features the library detects, as names of ``table.feature_bits``."""
    lib.ck_cpu_features.restype = c_int
    bits = lib.ck_cpu_features()
    return [name for i, name in enumerate(table.feature_bits) if bits >> i & 1]


def select_isa(table: IsaTable, choice: str, features: list[str]) -> str:
    """The best library variant allowed by ``choice`` (CPU_KERNEL_ISA) that the CPU runs.

    :raises ValueError: ``choice`` is unknown or needs features the CPU lacks.
    """
    if choice not in table.choices:
        raise ValueError(f"CPU_KERNEL_ISA={choice!r} is not one of: {', '.join(table.choices)}")
    for isa in table.choices[choice]:
        if all(f in features for f in table.requirements[isa]):
            return isa
    need = table.requirements[table.choices[choice][-1]]
    raise ValueError(
        f"CPU_KERNEL_ISA={choice!r} needs {', '.join(need)} but this CPU has only {', '.join(features) or 'none'}"
    )


class NativeLib:
    """The kernels of one ISA variant, bound as attributes (``lib.rms_norm(...)``)."""

    def __init__(self, table: IsaTable, choice: str = "auto") -> None:
        self.cdll = load_library(table)
        self.features = cpu_features(table, self.cdll)
        self.isa = select_isa(table, choice, self.features)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.cdll, f"ck_{self.isa}_{name}")
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        self.max_head = self.attention_max_head()
        self.max_group = self.attention_max_group()
        #: whether the x8 kernel of this variant is vectorized (native/src/quant.cpp)
        self.x8_simd = bool(self.x8_vectorized())

    def bind_threads(self, cpus: list[int]) -> int:
        """Pin OpenMP thread ``i`` of the calling thread's pool to ``cpus[i]``; returns failures."""
        arr = (c_int * len(cpus))(*cpus)
        return self.cdll.ck_bind_threads(arr, len(cpus))
