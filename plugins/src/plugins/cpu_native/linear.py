"""Quantized linear layers: int8 weight-only, GGUF blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and
quantized Hugging Face checkpoints' weights repacked into those blocks (:mod:`plugins.cpu_native.int_linear`).

By default the GGUF block formats and int8 weights are repacked at load in groups of 8 rows
(:mod:`plugins.cpu_native.x8`; the K-quants and 5-bit formats as blocks of 32 with float32
scales, their values unchanged) and the activations rounded to int16 per block of 32, to 2^-16
of the block's largest magnitude (native/src/quant.cpp: the int8 kernel on two int8 halves;
1.3-2x the float32 kernels' speed on one thread, greedy tokens as transformers'); builds without
AVX-512 multiply batches of 7 rows or more (64 on 4-bit weights) in float32 on that layout. Where the int8 kernel is
not vectorized (NEON without the dot-product extension, s390x, the scalar build), and for E4M3
weights, the native kernel runs on the weights as stored: it dequantizes weight blocks in
registers (a few rows) or in L1 panels (more rows) and multiplies them into the float32
activations, the float32 product with the dequantized weights (native/src/matvec.cpp). With
``CPU_QUANT_ACTIVATIONS`` every x8 format rounds the activations to int8 per block of 32
instead, as llama.cpp does (faster, not exact). Other GGUF types are dequantized once at load
with ``gguf.quants.dequantize``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch
import torch.nn.functional as F
from plugins.cpu_native.bf16 import GELU_CODES, Bf16Weight, bf16_linear, pack_bf16
from plugins.cpu_native.int_linear import native_form
from plugins.cpu_native.library import (
    ACT16,
    DTYPE_BF16,
    DTYPE_F32,
    E4M3W,
    F32W,
    INT8,
    PER_TOKEN,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
)
from plugins.cpu_native.x8 import (
    FLOAT_SCALED,
    GROUP,
    X8_CODES,
    deinterleave_x8,
    float_scaled_rows,
    float_scaled_values,
    interleave_x8,
)
from plugins.errors import UnsupportedFeature
from plugins.gguf_quants import FORMATS, dequantize, row_bytes
from plugins.hugepages import HugePageArena
from plugins.int_quant import INT_FORMATS, IntWeight, round_activations
from plugins.kernels import GGUFWeight

#: GGUF types kept in their blocks, with their native format code
NATIVE_GGUF = {
    "Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1, "Q5_0": Q5_0, "Q5_1": Q5_1, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K,
}  # fmt: skip
#: torch dtypes the native kernels take, with their dtype codes (shared by kernels.py and runner.py)
NATIVE_DTYPES = {torch.float32: DTYPE_F32, torch.bfloat16: DTYPE_BF16}


def native_bias(bias: torch.Tensor | None) -> tuple[int | None, int] | None:
    """The kernels' ``(bias pointer, dtype code)`` arguments: ``(None, DTYPE_F32)`` for no
    bias; None if the bias is not a contiguous float32/bfloat16 tensor they can read."""
    if bias is None:
        return None, DTYPE_F32
    if bias.dtype in NATIVE_DTYPES and bias.is_contiguous():
        return bias.data_ptr(), NATIVE_DTYPES[bias.dtype]
    return None


def native_rows(
    x: torch.Tensor, k: int, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int | None, int]]:
    """``x`` as 2-D rows of ``k`` with unit stride (copied only where they are not), and the bias
    with its kernel arguments (:func:`native_bias`): a float32 copy where the kernels cannot read it
    as it is, which the caller keeps alive for the call."""
    x2 = x.reshape(-1, k)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    bias_arg = native_bias(bias)
    if bias_arg is None:
        bias = bias.float().contiguous()
        bias_arg = native_bias(bias)
    return x2, bias, bias_arg


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight prepared for :meth:`QuantLinearMixin.linear`.

    ``data`` holds ``out_features`` rows in format ``fmt`` (``"int8"``, a GGUF type, ``"E4M3"``),
    as stored (``code``: the format's code) or repacked by :func:`plugins.cpu_native.x8.interleave_x8`
    (``code``: its x8 code, :data:`plugins.cpu_native.x8.X8_CODES`); ``scales`` the per-row
    float32 scales of ``"int8"`` and E4M3 (padded with zeros to whole groups of 8 when repacked).
    """

    fmt: str
    code: int
    data: torch.Tensor
    scales: torch.Tensor | None
    out_features: int
    in_features: int
    #: act-order checkpoints: column ``k`` of ``data`` multiplies input feature ``perm[k]``
    perm: torch.Tensor | None = None
    #: x8 only: round activations to int8 per row (W8A8 checkpoints) instead of per block of 32
    per_token: bool = False
    #: E4M3 weights of FP8 W8A8 checkpoints: the activations' FP8 rounding, done before the kernel
    #: (:func:`plugins.int_quant.round_activations`), and its static input scale
    fp8_activations: str | None = None
    input_scale: torch.Tensor | None = None
    #: x8 only: the default path's int16 activations per block of 32 (else int8 ones)
    act16: bool = False
    #: data pointers of ``data`` and ``scales`` (0 if none), taken once for the kernel calls
    data_ptr: int = field(init=False, repr=False)
    scales_ptr: int = field(init=False, repr=False)
    #: the format code the kernel is called with
    call_code: int = field(init=False, repr=False)
    #: the weight rounded to bfloat16 and packed for ``linear_bf16w``, made once on first use
    #: (:meth:`QuantLinearMixin.bf16_panels`): empty, or the one :class:`Bf16Weight`
    panels: list[Bf16Weight] = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_ptr", self.data.data_ptr())
        object.__setattr__(self, "scales_ptr", 0 if self.scales is None else self.scales.data_ptr())
        flags = (PER_TOKEN if self.per_token else 0) + (ACT16 if self.act16 else 0)
        object.__setattr__(self, "call_code", self.code + flags)

    @property
    def interleaved(self) -> bool:
        """Whether ``data`` is in the x8 layout (the int8-activation kernel's)."""
        return self.code in X8_CODES.values()

    def rows(self) -> torch.Tensor:
        """``data`` one row of blocks per output feature: as stored, or for the K-quants and
        5-bit formats in the x8 layout, the float-scaled blocks they were rewritten as."""
        if not self.interleaved:
            return self.data
        return deinterleave_x8(self.data, self.code, self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[out, in]`` matrix (for checks and the odd-shaped fallback), columns
        in ``data``'s order (before ``perm``)."""
        if self.code in (INT8, X8_CODES[INT8]):
            return self.rows().float() * self.scales[: self.out_features, None]
        if self.code in FLOAT_SCALED:
            return float_scaled_values(self.code, self.rows())
        if self.code == E4M3W:
            return self.data.view(torch.float8_e4m3fn).float() * self.scales[:, None]
        if self.fmt in FORMATS:
            return dequantize(self.fmt, self.rows(), self.out_features, self.in_features)
        import gguf

        kind = gguf.GGMLQuantizationType[self.fmt]
        return torch.from_numpy(gguf.quants.dequantize(self.rows().numpy(), kind)).float()

    def to_x8(self, act16: bool = False) -> QuantizedWeight:
        """The same weight repacked for the int8-activation kernel (``act16``: run with int16
        activations, the default path)."""
        code = X8_CODES[self.code]
        scales = None if self.scales is None else F.pad(self.scales, (0, -self.out_features % GROUP))
        rows = self.data
        if code in FLOAT_SCALED:
            rows = float_scaled_rows(self.fmt, code, self.data, self.out_features, self.in_features)
        return QuantizedWeight(
            self.fmt, code, interleave_x8(rows, code), scales, self.out_features, self.in_features, self.perm,
            self.per_token, act16=act16,
        )  # fmt: skip


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """Symmetric per-output-channel int8: ``w ~= q * scale[row]``, ``q`` in [-127, 127]."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", INT8, q.contiguous(), scales.contiguous(), *w.shape)


def gguf_weight(weight: GGUFWeight) -> QuantizedWeight | torch.Tensor:
    """Keep the blocks of :data:`NATIVE_GGUF`'s types as they are; dequantize every other GGUF type to float32 (once, at load)."""
    data = weight.data.reshape(weight.rows, -1).contiguous()
    code = NATIVE_GGUF.get(weight.qtype)
    if code is not None and weight.cols % FORMATS[weight.qtype][0] == 0:
        expected = row_bytes(weight.qtype, weight.cols)
        if data.shape[1] != expected:
            raise ValueError(
                f"GGUF {weight.qtype} weight [{weight.rows}, {weight.cols}] needs {expected} bytes a row, "
                f"got {data.shape[1]}"
            )
        return QuantizedWeight(weight.qtype, code, data, None, weight.rows, weight.cols)
    import gguf

    try:
        kind = gguf.GGMLQuantizationType[weight.qtype]
    except KeyError:
        raise UnsupportedFeature(f"unknown GGUF quantization type {weight.qtype!r}") from None
    dense = gguf.quants.dequantize(data.numpy(), kind)
    return torch.from_numpy(dense.reshape(weight.rows, weight.cols)).float()


def checkpoint_weight(weight: IntWeight) -> QuantizedWeight | IntWeight:
    """A quantized checkpoint's weight in a native block format (:mod:`plugins.cpu_native.int_linear`),
    or as it came when it has none (it then runs the SDK reference)."""
    form = native_form(weight)
    if form is None:
        return weight
    fmt, code, data, scales = form
    per_token = weight.activations == "int8_per_token"
    fp8 = weight.activations if code == E4M3W else None
    return QuantizedWeight(
        fmt, code, data, scales, weight.rows, weight.cols, weight.perm, per_token, fp8, weight.input_scale
    )


#: float32 weight matrices of this many elements or more go to the huge-page arena; smaller
#: ones (a fraction of a 2 MiB page) stay where they are
DENSE_ARENA_MIN = 1 << 16


class QuantLinearMixin:
    """``prepare_linear`` / ``linear`` with native quantized kernels (needs ``self.lib``)."""

    supported_quantizations = frozenset({"int8", "gguf", "bf16"}) | INT_FORMATS

    def prepare_linear(self, weight: torch.Tensor | GGUFWeight | IntWeight, quantization: str | None) -> Any:
        if quantization == "bf16":
            return self._bf16_weight(weight)
        if isinstance(weight, IntWeight):
            prepared = checkpoint_weight(weight)
            return self._kernel_layout(prepared) if isinstance(prepared, QuantizedWeight) else prepared
        if isinstance(weight, GGUFWeight) or quantization == "int8":
            prepared = gguf_weight(weight) if isinstance(weight, GGUFWeight) else quantize_int8(weight)
            return self._kernel_layout(prepared) if isinstance(prepared, QuantizedWeight) else self._dense(prepared)
        if quantization in (None, "gguf") or quantization in INT_FORMATS:  # full-precision tensors
            return self._dense(weight)
        raise UnsupportedFeature(
            f"quantization {quantization!r} is not supported by the native CPU kernels; "
            f"supported: None, {', '.join(sorted(self.supported_quantizations))}"
        )

    def _bf16_weight(self, weight: Any) -> Bf16Weight:
        """A full-precision weight rounded to bfloat16 and packed (:mod:`plugins.cpu_native.bf16`)."""
        if not isinstance(weight, torch.Tensor):
            raise UnsupportedFeature(f"quantization 'bf16' rounds full-precision weights, not {type(weight).__name__}")
        if not self.lib.linear_bf16w_ready():
            raise UnsupportedFeature(
                f"quantization 'bf16' needs the linear_bf16w kernel (a CPU with AVX512_BF16); "
                f"the {self.lib.isa} kernels have none"
            )
        return pack_bf16(weight)

    def bf16_panels(self, w: QuantizedWeight) -> Bf16Weight | None:
        """``w`` rounded to bfloat16 and packed for bfloat16 products of ``bf16_panel_min_rows``
        or more rows (made on the first call, kept with ``w``: 2 bytes a weight), or None where the
        kernels do not prepack (``bf16_panel_min_rows`` 0) or ``w`` takes its activations transformed
        (act-order, FP8 rounding, int8 activations)."""
        if not self.bf16_panel_min_rows or w.perm is not None or w.fp8_activations is not None or w.in_features % 32:
            return None
        if w.interleaved and not w.act16:
            return None
        if not w.panels:
            w.panels.append(pack_bf16(w.dequantize()))
        return w.panels[0]

    def _kernel_layout(self, w: QuantizedWeight) -> QuantizedWeight:
        """``w`` in the layout of the kernel that runs it: x8 with int8 activations (W8A8
        checkpoints, as calibrated: per token; every x8 format with ``CPU_QUANT_ACTIVATIONS``), x8
        with int16 ones (the default path where the x8 kernel is vectorized), else as stored. The
        x8 kernel takes whole blocks of 32 columns (other widths: :meth:`linear` dequantizes)."""
        if w.in_features % 32 or w.code not in X8_CODES:
            return w
        if w.per_token or self.quantize_activations:
            return self._on_huge_pages(w.to_x8())
        return self._on_huge_pages(w.to_x8(act16=True)) if self.lib.x8_simd else w

    @cached_property
    def weight_arena(self) -> HugePageArena:
        """Where the repacked weights live: memory in transparent huge pages (:mod:`plugins.hugepages`)."""
        return HugePageArena()

    def _dense(self, weight: torch.Tensor) -> torch.Tensor:
        """A full-precision weight as the kernels take it: a float32 matrix (the F16/F32 GGUF files,
        float32 checkpoints; the F32W kernel streams it at batch 1) copied into :attr:`weight_arena`
        (the F16 default model's batch-1 decode 1.17x on a Zen 4), other dtypes as they are."""
        if weight.dtype != torch.float32 or weight.dim() != 2 or weight.numel() < DENSE_ARENA_MIN:
            return weight
        return self.weight_arena.copy(weight.contiguous())

    def _on_huge_pages(self, w: QuantizedWeight) -> QuantizedWeight:
        """``w`` with its data copied into :attr:`weight_arena` (a batch-1 step streams it with few TLB misses)."""
        return replace(w, data=self.weight_arena.copy(w.data))

    def linear(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            if weight.perm is not None:
                x = x.index_select(-1, weight.perm)
            if weight.fp8_activations is not None:
                rounded = round_activations(x.float(), weight.fp8_activations, weight.input_scale)
                return self._quantized_linear(rounded.contiguous(), weight, bias).to(x.dtype)
            if x.dtype == torch.bfloat16 and x.numel() >= self.bf16_panel_min_rows * weight.in_features:
                panels = self.bf16_panels(weight)
                if panels is not None:
                    return self._bf16_linear(x, panels, bias)
            return self._quantized_linear(x, weight, bias)
        if isinstance(weight, Bf16Weight):
            return self._bf16_linear(x, weight, bias)
        if isinstance(weight, IntWeight):  # no native form: the SDK reference
            return weight.reference_linear(x, bias)
        dt, bias_arg = NATIVE_DTYPES.get(x.dtype), native_bias(bias)
        if weight.dtype is torch.float32 and dt is not None and x.dim() == 2 and x.is_contiguous():
            rows, k = x.shape
            n = weight.shape[0]
            if k % 32 == 0 and weight.shape[1] == k and weight.is_contiguous() and bias_arg is not None:
                out = x.new_empty((rows, n))
                self._native_linear(F32W, weight.data_ptr(), 0, n, k, dt, x.data_ptr(), k, rows, out.data_ptr(),
                                    *bias_arg)  # fmt: skip
                return out
        # torch's GEMM on all compute threads (the engine thread keeps torch at one otherwise)
        prev = torch.get_num_threads()
        torch.set_num_threads(self.num_threads)
        try:
            if weight.dtype != x.dtype:  # e.g. a float32 dequantized GGUF weight in a bf16 model
                out = F.linear(x.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype))
                return out.to(x.dtype)
            return F.linear(x, weight, bias)
        finally:
            torch.set_num_threads(prev)

    def linear_gelu(
        self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None, approximate: str = "none"
    ) -> torch.Tensor:
        """bf16 weights: GELU in the kernel's epilogue; other weights: the SDK's two steps."""
        if isinstance(weight, Bf16Weight) and approximate in GELU_CODES:
            return self._bf16_linear(x, weight, bias, approximate)
        return super().linear_gelu(x, weight, bias, approximate)

    def _bf16_linear(
        self, x: torch.Tensor, w: Bf16Weight, bias: torch.Tensor | None, gelu: str | None = None
    ) -> torch.Tensor:
        if x.shape[-1] != w.in_features:
            raise ValueError(f"linear input has {x.shape[-1]} features, the weight expects {w.in_features}")
        dt = NATIVE_DTYPES.get(x.dtype)
        if dt is None:
            raise UnsupportedFeature(f"bf16 weights take float32 or bfloat16 activations, got {x.dtype}")
        x2, bias, bias_arg = native_rows(x, w.in_features, bias)
        out = bf16_linear(self.lib, x2, w, bias, gelu, self.num_threads, dt, bias_arg)
        return out.reshape(*x.shape[:-1], w.out_features)

    def _quantized_linear(self, x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        k, n = w.in_features, w.out_features
        dt = NATIVE_DTYPES.get(x.dtype)
        if bias is None and dt is not None and x.dim() == 2 and x.is_contiguous():
            # the decode step's case, kept short (few torch calls): this runs ~120 times a token
            rows, cols = x.shape
            if cols == k and k % 32 == 0:
                out = x.new_empty((rows, n))  # faster than torch.empty(..., dtype=)
                self._native_linear(w.call_code, w.data_ptr, w.scales_ptr, n, k, dt, x.data_ptr(), k, rows,
                                    out.data_ptr(), None, DTYPE_F32)  # fmt: skip
                return out
        if x.shape[-1] != k:
            raise ValueError(f"linear input has {x.shape[-1]} features, the weight expects {k}")
        if dt is None or k % 32:
            out = F.linear(x.float(), w.dequantize(), None if bias is None else bias.float())
            return out.to(x.dtype)
        x2, bias, bias_arg = native_rows(x, k, bias)
        out = x.new_empty((*x.shape[:-1], n))
        self._native_linear(w.call_code, w.data_ptr, w.scales_ptr, n, k, dt, x2.data_ptr(), x2.stride(0), x2.shape[0],
                            out.data_ptr(), *bias_arg)  # fmt: skip
        return out

    def _native_linear(self, code: int, w_ptr: int, scales_ptr: int, n: int, k: int, dt: int, x_ptr: int,
                       x_stride: int, rows: int, out_ptr: int, bias_ptr: int | None, bias_dt: int) -> None:  # fmt: skip
        """The native kernel on ``n`` weight rows in format ``code`` (scales: 0 if none):
        int8 activations for the x8 formats, float32 ones for the others."""
        status = self.lib.linear(
            code, w_ptr, scales_ptr or None, n, k, dt, x_ptr, x_stride, rows, out_ptr, bias_ptr, bias_dt,
            self.num_threads,
        )  # fmt: skip
        if status:
            raise MemoryError(f"the native linear kernel could not allocate its buffers ({rows}x{k} activations)")
