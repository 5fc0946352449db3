"""The native kernels of the CPU plugins (:class:`NativeCpuKernels`).

Each op calls the C++ kernel of the chosen ISA when the dtypes (float32, bfloat16)
and memory layout are ones it handles, and otherwise falls back to the torch
reference of :class:`plugins.kernels.Kernels`. Calls go straight to ctypes functions
bound once at construction, on the tensors' data pointers.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from plugins.attention import AttentionMetadata
from plugins.cpu_native.library import DTYPE_BF16, DTYPE_F16, IsaTable, NativeLib
from plugins.cpu_native.linear import NATIVE_DTYPES, QuantLinearMixin
from plugins.cpu_native.moe import NativeExperts, native_fused_moe, pack_experts
from plugins.kernels import Kernels
from plugins.kv_cache import calibrate
from plugins.lora import LoRAMapping
from plugins.moe import ExpertWeights

#: the one-byte cache dtype codes of native/src/fp8.h
FP8_CODES = {torch.float8_e4m3fn: 2, torch.float8_e5m2: 3}
#: the codes of caches whose dtype differs from the compute dtype's: written converted
#: (write_kv_cache_cast), read widened: bfloat16 and float16 under float32, the one-byte ones
CAST_CODES = {torch.bfloat16: DTYPE_BF16, torch.float16: DTYPE_F16, **FP8_CODES}


def cache_code(dtype: torch.dtype, cache_dtype: torch.dtype) -> int | None:
    """The native code of a KV cache of ``cache_dtype`` read under compute ``dtype``
    (native/src/attention.cpp), or None where the kernels have no such pair: the compute
    dtype's own, a one-byte one under either, bfloat16 / float16 under float32."""
    if cache_dtype == dtype:
        return NATIVE_DTYPES.get(dtype)
    if cache_dtype in FP8_CODES:
        return FP8_CODES[cache_dtype]
    return CAST_CODES.get(cache_dtype) if dtype == torch.float32 else None


def _rows(x: torch.Tensor) -> tuple[int, int, int] | None:
    """``(rows, columns, row stride)`` of ``x`` read as rows of its last dimension, or None
    if its layout is not expressible that way. Contiguous tensors (the decode step's case,
    ~30-120 calls a token) are answered with the fewest torch calls: each one's overhead counts."""
    if x.is_contiguous():
        n = x.shape[-1]
        return (x.numel() // n if n else 0), n, n
    if x.dim() == 2 and x.stride(1) == 1:
        rows, n = x.shape
        return rows, n, x.stride(0)
    return None


def _empty(x: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A new contiguous tensor of ``x``'s dtype (``new_empty`` with a tuple: cheaper per call
    than ``torch.empty(size, dtype=...)``, which adds up over a decode step's ~400 calls)."""
    return x.new_empty(shape)


def _heads_view(x: torch.Tensor) -> bool:
    """Whether ``x [T, H, D]`` has contiguous heads (any token stride)."""
    return x.dim() == 3 and x.stride(2) == 1 and x.stride(1) == x.shape[2]


def _row_slots(slots: torch.Tensor) -> bool:
    """Whether a LoRA mapping's ``row_slots`` are as the native kernels read them (contiguous int64)."""
    return slots.dtype == torch.int64 and slots.is_contiguous() and slots.device.type == "cpu"


class NativeCpuKernels(QuantLinearMixin, Kernels):
    """C++ kernels with runtime ISA dispatch.

    :param table: the plugin's library and its variants.
    :param isa: ``CPU_KERNEL_ISA``: ``"auto"`` (best the CPU runs) or one of ``table.choices``.
    :param num_threads: OpenMP threads per kernel (default: CPUs this process may use).
    :param quantize_activations: ``CPU_QUANT_ACTIVATIONS`` (:mod:`plugins.cpu_native.linear`).
    :param moe_prepack: ``CPU_MOE_PREPACK``: pack experts at load (:mod:`plugins.cpu_native.moe`).
    :param bf16_prepack: ``CPU_BF16_PREPACK``: bfloat16 products of many rows on GGUF/int8 weights
        packed once as bfloat16 (:meth:`bf16_panels`); taken where the library has ``linear_bf16w``
        (AVX512_BF16) and no tile unit (AMX builds keep their tile kernels).
    """

    def __init__(
        self,
        table: IsaTable,
        isa: str = "auto",
        num_threads: int | None = None,
        quantize_activations: bool = False,
        moe_prepack: bool = True,
        bf16_prepack: bool = True,
    ) -> None:
        self.lib = NativeLib(table, isa)
        self.num_threads = num_threads or len(os.sched_getaffinity(0))
        self.quantize_activations = quantize_activations
        self.moe_prepack = moe_prepack
        #: bfloat16 products of this many rows or more take a GGUF/int8 weight's packed panels; 0: never
        #: (``CPU_BF16_PREPACK`` off, or a library that keeps the weight's own format: native/src/encoder.cpp)
        self.bf16_panel_min_rows = self.lib.bf16_panel_min_rows() if bf16_prepack else 0

    @property
    def isa(self) -> str:
        """The library variant in use (e.g. ``avx512vnni``, ``neon_dotprod``, ``z14``, ``scalar``)."""
        return self.lib.isa

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if _heads_view(x) and not x.is_contiguous():  # q/k heads of a fused projection: normed as a copy
            x = x.contiguous()
        dt, wdt, rows = NATIVE_DTYPES.get(x.dtype), NATIVE_DTYPES.get(weight.dtype), _rows(x)
        if dt is None or wdt is None or rows is None or not weight.is_contiguous():
            return super().rms_norm(x, weight, eps)
        num_rows, n, stride = rows
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        self.lib.rms_norm(
            dt, wdt, out.data_ptr(), None, x.data_ptr(), stride, None, 0, weight.data_ptr(), num_rows, n, eps,
            self.num_threads,
        )  # fmt: skip
        return out

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt, wdt = NATIVE_DTYPES.get(x.dtype), NATIVE_DTYPES.get(weight.dtype)
        xr, rr = _rows(x), _rows(residual)
        if (
            dt is None or wdt is None or xr is None or rr is None or residual.dtype is not x.dtype
            or residual.shape != x.shape or not weight.is_contiguous()
        ):  # fmt: skip
            return super().fused_add_rms_norm(x, residual, weight, eps)
        (num_rows, n, xs), rs = xr, rr[2]
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        summed = torch.empty_like(x, memory_format=torch.contiguous_format)
        self.lib.rms_norm(
            dt, wdt, out.data_ptr(), summed.data_ptr(), x.data_ptr(), xs, residual.data_ptr(), rs,
            weight.data_ptr(), num_rows, n, eps, self.num_threads,
        )  # fmt: skip
        return out, summed

    def rotary_embedding(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dt, cdt = NATIVE_DTYPES.get(q.dtype), NATIVE_DTYPES.get(cos_sin_cache.dtype)
        d = q.shape[-1]
        if (
            dt is None or cdt is None or k.dtype != q.dtype or not _heads_view(q) or not _heads_view(k)
            or positions.dtype != torch.int64 or not positions.is_contiguous()
            or not cos_sin_cache.is_contiguous() or cos_sin_cache.shape[-1] != d or d % 2
        ):  # fmt: skip
            return super().rotary_embedding(positions, q, k, cos_sin_cache)
        q_out, k_out = (
            torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
        )
        pos, cache, tokens = positions.data_ptr(), cos_sin_cache.data_ptr(), q.shape[0]
        for src, dst in ((q, q_out), (k, k_out)):
            self.lib.rotary(
                dt, cdt, dst.data_ptr(), src.data_ptr(), src.stride(0), src.shape[1], d, pos, cache, tokens,
                self.num_threads,
            )  # fmt: skip
        return q_out, k_out

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        dt, rows = NATIVE_DTYPES.get(x.dtype), _rows(x)
        if dt is None or rows is None or rows[1] % 2:
            return super().silu_and_mul(x)
        num_rows, n, stride = rows
        out = _empty(x, (*x.shape[:-1], n // 2))
        self.lib.silu_and_mul(dt, out.data_ptr(), x.data_ptr(), stride, num_rows, n // 2, self.num_threads)
        return out

    def encoder_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: list[int],
        scale: float,
    ) -> torch.Tensor:
        """Native: one call for the whole batch (native/src/encoder.cpp), any token stride (q/k/v
        may be head views of one fused qkv output)."""
        dt = NATIVE_DTYPES.get(q.dtype)
        if (
            dt is None or k.dtype != q.dtype or v.dtype != q.dtype or not all(_heads_view(x) for x in (q, k, v))
            or k.shape != v.shape or q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]
            or query_start_loc.dtype != torch.int32 or not query_start_loc.is_contiguous()
        ):  # fmt: skip
            return super().encoder_attention(q, k, v, query_start_loc, seq_lens, scale)
        tokens, hq, d = q.shape
        out = _empty(q, (tokens, hq, d))
        status = self.lib.encoder_attention(
            dt, out.data_ptr(), q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
            query_start_loc.data_ptr(), len(seq_lens), hq, k.shape[1], d, scale, self.num_threads,
        )  # fmt: skip
        if status:
            raise MemoryError(f"encoder_attention could not allocate its scratch for {max(seq_lens)}-token sequences")
        return out

    def apply_token_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """Native: the forbidden logits of each row's zero bits set to -inf in one pass over its words."""
        if logits.dtype != torch.float32 or logits.stride(1) != 1 or bitmask.dtype != torch.int32:
            return super().apply_token_bitmask(logits, bitmask, rows)
        words = bitmask.contiguous()
        index = torch.tensor(rows, dtype=torch.int64)
        self.lib.apply_token_bitmask(
            logits.data_ptr(), logits.stride(0), words.data_ptr(), words.shape[1], index.data_ptr(), len(rows),
            logits.shape[1],
        )  # fmt: skip

    def write_kv_cache(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scale: torch.Tensor | None = None,
    ) -> None:
        if k_cache.dtype != k.dtype and k_cache.dtype in CAST_CODES:
            return self._write_cast_kv_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)
        if (
            kv_scale is not None or k_cache.dtype != k.dtype or v.dtype != k.dtype or v_cache.dtype != k.dtype
            or not _heads_view(k) or not _heads_view(v) or k.shape[1:] != k_cache.shape[2:]
            or not k_cache.is_contiguous() or not v_cache.is_contiguous() or k_cache.shape != v_cache.shape
            or slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous()
        ):  # fmt: skip
            return super().write_kv_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)
        size = k.element_size()
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        bad = self.lib.write_kv_cache(
            k.data_ptr(), k.stride(0) * size, v.data_ptr(), v.stride(0) * size, k_cache.data_ptr(),
            v_cache.data_ptr(), slot_mapping.data_ptr(), k.shape[0], k.shape[1] * k.shape[2] * size, num_slots,
        )  # fmt: skip
        if bad:
            raise IndexError(f"slot_mapping has {bad} slot(s) >= the cache's {num_slots} slots")

    def _write_cast_kv_cache(self, k, v, k_cache, v_cache, slot_mapping, kv_scale) -> None:
        dt = NATIVE_DTYPES.get(k.dtype)
        if (
            dt is None or v.dtype != k.dtype or v_cache.dtype != k_cache.dtype
            or not _heads_view(k) or not _heads_view(v) or k.shape[1:] != k_cache.shape[2:]
            or not k_cache.is_contiguous() or not v_cache.is_contiguous() or k_cache.shape != v_cache.shape
            or slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous()
        ):  # fmt: skip
            return super().write_kv_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)
        scales = [1.0, 1.0] if kv_scale is None else kv_scale.tolist()
        if min(scales) <= 0:  # the layer's first write sets its scales (plugins.kv_cache)
            keep = slot_mapping >= 0
            if bool(keep.any()):
                calibrate(kv_scale, k[keep], v[keep])
                scales = kv_scale.tolist()
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        bad = self.lib.write_kv_cache_cast(
            dt, CAST_CODES[k_cache.dtype], k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(),
            v_cache.data_ptr(), slot_mapping.data_ptr(), k.shape[0], k.shape[1] * k.shape[2], num_slots, *scales,
        )  # fmt: skip
        if bad < 0:
            raise ValueError(f"the native cache write does not cast {k.dtype} into a {k_cache.dtype} cache")
        if bad:
            raise IndexError(f"slot_mapping has {bad} slot(s) >= the cache's {num_slots} slots")

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        kv_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        dt = NATIVE_DTYPES.get(q.dtype)
        # a one-byte cache is read with its scales (1 for E5M2)
        cache_dt = cache_code(q.dtype, k_cache.dtype)
        k_scale, v_scale = (1.0, 1.0) if kv_scale is None else kv_scale.tolist()
        tokens, hq, d = q.shape
        hk = k_cache.shape[2]
        tables = meta.block_tables
        if (
            dt is None or cache_dt is None or v_cache.dtype != k_cache.dtype or not _heads_view(q)
            or not k_cache.is_contiguous() or not v_cache.is_contiguous() or k_cache.shape[3] != d
            or hq % hk or hq // hk > self.lib.max_group or d > self.lib.max_head
            or tables.dtype != torch.int32 or tables.stride(-1) != 1
            or meta.query_start_loc.dtype != torch.int32 or meta.seq_lens.dtype != torch.int32
            or not meta.query_start_loc.is_contiguous() or not meta.seq_lens.is_contiguous()
        ):  # fmt: skip
            return super().paged_attention(q, k_cache, v_cache, meta, scale, sliding_window, kv_scale)
        out = _empty(q, (tokens, hq, d))
        unread = self.lib.paged_attention(
            dt, cache_dt, out.data_ptr(), q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), k_scale,
            v_scale, meta.query_start_loc.data_ptr(), meta.seq_lens.data_ptr(), tables.data_ptr(), tables.stride(0),
            tokens, len(meta.seq_lens_host), hq, hk, d, k_cache.shape[1], scale, sliding_window or 0, self.num_threads,
        )  # fmt: skip
        if unread:  # cache_code() names only the pairs the kernel reads
            raise ValueError(f"the native paged_attention does not read a {k_cache.dtype} cache under {q.dtype}")
        return out

    def prepare_experts(self, experts: ExpertWeights, quantization: str | None) -> Any:
        """Each expert's projections prepared as dense linears' weights and stacked for the native
        kernel (:func:`plugins.cpu_native.moe.pack_experts`); experts it does not take stay as loaded."""
        packed = pack_experts(self, experts, quantization, self.moe_prepack)
        return experts if packed is None else packed

    def fused_moe(
        self, x: torch.Tensor, experts: Any, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """Native on packed experts (native/src/moe.cpp: grouped by expert, each expert's weights
        read once for all of its tokens); the SDK's grouped default on others."""
        if isinstance(experts, NativeExperts):
            return native_fused_moe(self.lib, experts, x, topk_weights, topk_ids, self.num_threads)
        return super().fused_moe(x, experts, topk_weights, topk_ids)

    def lora_shrink(self, x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        """Native (native/src/lora.cpp): a slot's rows in pairs against 4 rows of ``A`` at a time."""
        dt, rows = NATIVE_DTYPES.get(x.dtype), _rows(x)
        slots = mapping.row_slots
        r_total, in_features = lora_a.shape[1], lora_a.shape[2]
        if (
            dt is None or rows is None or x.dim() != 2 or rows[1] != in_features or x.shape[0] < mapping.num_rows
            or lora_a.dtype != x.dtype or not lora_a.is_contiguous() or not _row_slots(slots)
        ):  # fmt: skip
            return super().lora_shrink(x, lora_a, mapping)
        # rows past the mapping's (a runner's padding) are base rows: zeros
        h = (torch.zeros if x.shape[0] > mapping.num_rows else torch.empty)(x.shape[0], r_total, dtype=torch.float32)
        status = self.lib.lora_shrink(dt, x.data_ptr(), rows[2], mapping.num_rows, lora_a.data_ptr(), r_total,
                                      in_features, slots.data_ptr(), h.data_ptr(), self.num_threads)  # fmt: skip
        if status:
            raise MemoryError("the native lora_shrink could not allocate its row groups")
        return h

    def lora_expand(
        self, y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, mapping: LoRAMapping, offset: int = 0
    ) -> None:
        """Native (native/src/lora.cpp): each output a dot over the rank, or for a slot with many rows
        ``B`` transposed once and each row's update an axpy over the outputs."""
        dt, (num_slots, n, rank) = NATIVE_DTYPES.get(y.dtype), lora_b.shape
        if (
            dt is None or y.dim() != 2 or y.stride(1) != 1 or lora_b.dtype != y.dtype or not lora_b.is_contiguous()
            or h.dtype != torch.float32 or h.stride(1) != 1 or h.shape[1] != rank or rank > self.lib.lora_max_rank()
            or min(y.shape[0], h.shape[0]) < mapping.num_rows or y.shape[1] < offset + n
            or not _row_slots(mapping.row_slots)
        ):  # fmt: skip
            return super().lora_expand(y, h, lora_b, mapping, offset)
        status = self.lib.lora_expand(
            dt, y.data_ptr() + offset * y.element_size(), y.stride(0), h.data_ptr(), h.stride(0), lora_b.data_ptr(),
            n, rank, mapping.row_slots.data_ptr(), mapping.num_rows, num_slots, self.num_threads,
        )  # fmt: skip
        if status:
            raise MemoryError("the native lora_expand could not allocate its row groups or B's transpose")
