"""Quantized linear layers: int8 weight-only and GGUF blocks (Q8_0, Q4_0, Q4_1).

Every batch size runs the native kernel on the weights as stored: it dequantizes weight
blocks in registers (a few rows) or in L1 panels (more rows) and multiplies them into the
float32 activations, so the result is the float32 product with the dequantized weights
(csrc/matvec.cpp); with ``CPU_QUANT_ACTIVATIONS`` batches of up to 16 rows round the
activations to int8 instead, as llama.cpp does (csrc/quant.cpp: faster, not exact).
Other GGUF types (Q4_K, Q6_K, ...) are dequantized once at load with
``gguf.quants.dequantize``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from plugins.errors import UnsupportedFeature
from plugins.kernels import GGUFWeight

from plugin_cpu_x86.native import DTYPE_BF16, DTYPE_F32, F32W, INT8, Q4_0, Q4_1, Q8_0

#: GGUF types kept in their blocks, with their native format code
NATIVE_GGUF = {"Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1}
_BLOCK_BYTES = {Q8_0: 34, Q4_0: 18, Q4_1: 20, INT8: 32}
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


@dataclass(frozen=True)
class QuantizedWeight:
    """A linear weight prepared for :meth:`QuantLinearMixin.linear`.

    ``data`` holds ``out_features`` rows in format ``fmt`` (``"int8"``, ``"Q8_0"``,
    ``"Q4_0"``, ``"Q4_1"``); ``scales`` the per-row float32 scales of ``"int8"``.
    """

    fmt: str
    code: int
    data: torch.Tensor
    scales: torch.Tensor | None
    out_features: int
    in_features: int
    #: data pointers of ``data`` and ``scales`` (0 if none), taken once for the kernel calls
    data_ptr: int = field(init=False, repr=False)
    scales_ptr: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_ptr", self.data.data_ptr())
        object.__setattr__(self, "scales_ptr", 0 if self.scales is None else self.scales.data_ptr())

    def dequantize(self) -> torch.Tensor:
        """The float32 ``[out, in]`` matrix (for checks and the odd-shaped fallback)."""
        if self.code == INT8:
            return self.data.float() * self.scales[:, None]
        import gguf

        kind = gguf.GGMLQuantizationType[self.fmt]
        return torch.from_numpy(gguf.quants.dequantize(self.data.numpy(), kind)).float()


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """Symmetric per-output-channel int8: ``w ~= q * scale[row]``, ``q`` in [-127, 127]."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127.0).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight("int8", INT8, q.contiguous(), scales.contiguous(), *w.shape)


def gguf_weight(weight: GGUFWeight) -> QuantizedWeight | torch.Tensor:
    """Keep Q8_0/Q4_0/Q4_1 blocks as they are; dequantize every other GGUF type to float32."""
    data = weight.data.reshape(weight.rows, -1).contiguous()
    code = NATIVE_GGUF.get(weight.qtype)
    if code is not None and weight.cols % 32 == 0:
        expected = weight.cols // 32 * _BLOCK_BYTES[code]
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


class QuantLinearMixin:
    """``prepare_linear`` / ``linear`` with native quantized kernels (needs ``self.lib``)."""

    supported_quantizations = frozenset({"int8", "gguf"})

    def prepare_linear(self, weight: torch.Tensor | GGUFWeight, quantization: str | None) -> Any:
        if isinstance(weight, GGUFWeight):
            return gguf_weight(weight)
        if quantization == "int8":
            return quantize_int8(weight)
        if quantization in (None, "gguf"):  # full-precision tensors of a GGUF file
            return weight
        raise UnsupportedFeature(
            f"quantization {quantization!r} is not supported by cpu_x86; supported: None, int8, gguf"
        )

    def linear(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, QuantizedWeight):
            return self._quantized_linear(x, weight, bias)
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

    def _quantized_linear(self, x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
        k, n = w.in_features, w.out_features
        dt = NATIVE_DTYPES.get(x.dtype)
        if bias is None and dt is not None and x.dim() == 2 and x.is_contiguous():
            # the decode step's case, kept short (few torch calls): this runs ~120 times a token
            rows, cols = x.shape
            if cols == k and k % 32 == 0:
                out = x.new_empty((rows, n))  # faster than torch.empty(..., dtype=)
                self._native_linear(w.code, w.data_ptr, w.scales_ptr, n, k, dt, x.data_ptr(), k, rows,
                                    out.data_ptr(), None, DTYPE_F32)  # fmt: skip
                return out
        if x.shape[-1] != k:
            raise ValueError(f"linear input has {x.shape[-1]} features, the weight expects {k}")
        if dt is None or k % 32:
            out = F.linear(x.float(), w.dequantize(), None if bias is None else bias.float())
            return out.to(x.dtype)
        x2 = x.reshape(-1, k)
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        if native_bias(bias) is None:
            bias = bias.float().contiguous()
        out = x.new_empty((*x.shape[:-1], n))
        self._native_linear(w.code, w.data_ptr, w.scales_ptr, n, k, dt, x2.data_ptr(), x2.stride(0), x2.shape[0],
                            out.data_ptr(), *native_bias(bias))  # fmt: skip
        return out

    def _native_linear(self, code: int, w_ptr: int, scales_ptr: int, n: int, k: int, dt: int, x_ptr: int,
                       x_stride: int, rows: int, out_ptr: int, bias_ptr: int | None, bias_dt: int) -> None:  # fmt: skip
        """The native kernel on ``n`` weight rows in format ``code`` (scales: 0 if none).

        float32 activations, or int8 ones for small batches with CPU_QUANT_ACTIVATIONS
        (float32 weights always take float32 activations).
        """
        status = self.lib.linear(
            code, w_ptr, scales_ptr or None, n, k, dt, x_ptr, x_stride, rows, out_ptr, bias_ptr, bias_dt,
            int(self.quantize_activations), self.num_threads,
        )  # fmt: skip
        if status:
            raise MemoryError(f"the native linear kernel could not allocate its buffers ({rows}x{k} activations)")
