"""Load the C++ kernel library and bind one ISA's entry points through ctypes.

The library (``_cx86.so``, built by CMake) exports every kernel once per ISA as
``ck_<isa>_<kernel>`` plus ``ck_cpu_features()`` (cpuid). :class:`NativeLib`
binds the functions of one ISA with their argtypes once, so that a kernel call is a
single ctypes call on integer data pointers.
"""

from __future__ import annotations

import ctypes
import importlib.util
from ctypes import c_float, c_int, c_long, c_void_p

from plugins.errors import PlatformUnavailable

#: ISA variants the library holds, best first, with the cpuid features each needs
ISA_REQUIREMENTS = {
    "avx512vnni": ("AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ", "AVX512_VNNI", "AVX2", "FMA", "F16C"),
    "avx512": ("AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ", "AVX2", "FMA", "F16C"),
    "avx2": ("AVX2", "FMA", "F16C"),
    "scalar": (),
}
#: bit order of ck_cpu_features() (native/src/features_x86_64.cpp)
FEATURE_BITS = (
    "AVX2", "FMA", "F16C", "AVX512F", "AVX512BW", "AVX512VL", "AVX512DQ", "AVX512_VNNI", "AVX512_BF16", "AMX",
)  # fmt: skip
#: CPU_KERNEL_ISA choices -> the variants they may pick, best first
ISA_CHOICES = {
    "auto": ("avx512vnni", "avx512", "avx2", "scalar"),
    "avx512": ("avx512vnni", "avx512"),
    "avx2": ("avx2",),
    "scalar": ("scalar",),
}
DTYPE_F32, DTYPE_BF16 = 0, 1
Q8_0, Q4_0, Q4_1, INT8, F32W = 0, 1, 2, 3, 4
#: a format repacked in groups of 8 rows (native/src/quant.cpp, int8 activations): its code + X8
X8 = 8

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
    # dtype, out, q, q_stride, k_cache, v_cache, starts, seq_lens, tables, table_stride,
    # tokens, num_seqs, hq, hk, d, block_size, scale, nthreads
    "paged_attention": (
        None,
        [
            c_int,
            _P,
            _P,
            c_long,
            _P,
            _P,
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
            c_int,
        ],
    ),  # fmt: skip
    "attention_max_head": (c_long, []),
    "attention_max_group": (c_long, []),
    # qt, w, row_scale, n, k, dtype, x, x_stride, rows, out, bias, bias_dtype, nthreads
    # (native/src/quant.cpp: int8 activations for the x8 formats, float32 ones for the others)
    "linear": (c_int, [c_int, _P, _P, c_long, c_long, c_int, _P, c_long, c_long, _P, _P, c_int, c_int]),
    # decoder, step, nthreads (native/src/decode.cpp; structures in plugin_cpu_x86/runner.py)
    "decode": (c_int, [_P, _P, c_int]),
}


def library_path() -> str:
    """Path of the built kernel library, found like an extension module (works editable)."""
    spec = importlib.util.find_spec("plugin_cpu_x86._cx86")
    if spec is None or not spec.origin:
        raise PlatformUnavailable(
            "plugin_cpu_x86's native library _cx86.so is missing: reinstall with `pip install ./plugin_cpu_x86` "
            "(needs a C++17 compiler, CMake and OpenMP)"
        )
    return spec.origin


def load_library() -> ctypes.CDLL:
    """Open the kernel library (torch first, so its OpenMP runtime is the one shared)."""
    import torch  # noqa: F401  (loads torch's libgomp; ours then resolves to the same runtime)

    return ctypes.CDLL(library_path())


def cpu_features(lib: ctypes.CDLL) -> list[str]:
    """The CPU features cpuid reports (and the OS enables), as names of :data:`FEATURE_BITS`."""
    lib.ck_cpu_features.restype = c_int
    bits = lib.ck_cpu_features()
    return [name for i, name in enumerate(FEATURE_BITS) if bits >> i & 1]


def select_isa(choice: str, features: list[str]) -> str:
    """The best library variant allowed by ``choice`` (CPU_KERNEL_ISA) that the CPU runs.

    :raises ValueError: ``choice`` is unknown or needs features the CPU lacks.
    """
    if choice not in ISA_CHOICES:
        raise ValueError(f"CPU_KERNEL_ISA={choice!r} is not one of: {', '.join(ISA_CHOICES)}")
    for isa in ISA_CHOICES[choice]:
        if all(f in features for f in ISA_REQUIREMENTS[isa]):
            return isa
    need = ISA_REQUIREMENTS[ISA_CHOICES[choice][-1]]
    raise ValueError(
        f"CPU_KERNEL_ISA={choice!r} needs {', '.join(need)} but this CPU has only {', '.join(features) or 'none'}"
    )


class NativeLib:
    """The kernels of one ISA variant, bound as attributes (``lib.rms_norm(...)``)."""

    def __init__(self, choice: str = "auto") -> None:
        self.cdll = load_library()
        self.features = cpu_features(self.cdll)
        self.isa = select_isa(choice, self.features)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(self.cdll, f"ck_{self.isa}_{name}")
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)
        self.max_head = self.attention_max_head()
        self.max_group = self.attention_max_group()

    def bind_threads(self, cpus: list[int]) -> int:
        """Pin OpenMP thread ``i`` of the calling thread's pool to ``cpus[i]``; returns failures."""
        arr = (c_int * len(cpus))(*cpus)
        return self.cdll.ck_bind_threads(arr, len(cpus))
