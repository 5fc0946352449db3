"""Integer-quantized checkpoint weights (:class:`plugins.int_quant.IntWeight`) on the native kernels.

The codes are repacked, not dequantized, into the block formats the native kernels run
(native/src/blocks.h): per-channel int8 -> ``INT8`` rows (the same bytes and float32
scales), int8 in groups -> ``Q8_0``, symmetric int4 -> ``Q4_0`` (``d * (u - 8)``, ``u`` the
code + 8), int4 with zero points -> ``Q4_1`` (``d * u + m``, ``m = -d * (zero + 8)``). A
group of ``g`` columns becomes ``g / 32`` blocks sharing its scale; the block scales are
float16 (exact for bf16/fp16 checkpoints' scales in float16's normal range, a 2^-11
relative rounding for float32 ones). FP8 (float8 E4M3) codes with a scale per row keep their
bytes (``E4M3W``, the row scales in float32). What does not fit (int8 with zero points, groups
not a multiple of 32, scales outside float16's range) stays an :class:`IntWeight` and runs
the SDK's reference.
"""

from __future__ import annotations

import logging

import torch
from plugins.cpu_native.library import E4M3W, INT8, Q4_0, Q4_1, Q8_0
from plugins.int_quant import IntWeight

logger = logging.getLogger(__name__)

_HALF_NORMAL = torch.finfo(torch.float16).tiny  # below: float16 subnormals lose bits
_HALF_MAX = torch.finfo(torch.float16).max


def native_form(weight: IntWeight) -> tuple[str, int, torch.Tensor, torch.Tensor | None] | None:
    """``(format name, code, rows of blocks, per-row float32 scales or None)`` for the native
    kernels, or None (with the reason logged) when the weight has no native form."""
    n, k = weight.rows, weight.cols
    channel = weight.group_size == k
    if k % 32 == 0 and weight.codes.dtype == torch.float8_e4m3fn:  # one scale per row (IntWeight checks)
        return "fp8_e4m3", E4M3W, weight.codes.contiguous().view(torch.uint8), weight.scales.reshape(n).float()
    if weight.codes.dtype != torch.int8:
        return _none(weight, f"{weight.codes.dtype} codes")
    if k % 32 or (weight.group_size % 32 and not channel):
        return _none(weight, f"groups of {weight.group_size} columns (the kernels take multiples of 32)")
    if weight.bits == 8 and weight.zeros is None and channel:
        return "int8", INT8, weight.codes.contiguous(), weight.scales.reshape(n).contiguous()
    if weight.bits == 8 and weight.zeros is not None:
        return _none(weight, "8-bit codes with zero points")
    scales = weight.scales.repeat_interleave(weight.group_size // 32 if not channel else k // 32, dim=1)
    if not _fits_half(scales):
        return _none(weight, "scales outside float16's normal range")
    d = _half_bytes(scales)  # [n, nb, 2]
    codes = weight.codes.view(n, k // 32, 32)
    if weight.bits == 8:
        return "Q8_0", Q8_0, torch.cat([d, codes.view(torch.uint8)], dim=2).reshape(n, -1), None
    u = (codes.to(torch.int16) + 8).to(torch.uint8)
    nibbles = u[..., :16] | (u[..., 16:] << 4)  # byte i: element i low, element i + 16 high
    if weight.zeros is None:
        return "Q4_0", Q4_0, torch.cat([d, nibbles], dim=2).reshape(n, -1), None
    zeros = weight.zeros.float().repeat_interleave(scales.shape[1] // weight.zeros.shape[1], dim=1)
    m = -scales * (zeros + 8)
    if not _fits_half(m, allow_zero=True):
        return _none(weight, "zero-point offsets outside float16's range")
    return "Q4_1", Q4_1, torch.cat([d, _half_bytes(m), nibbles], dim=2).reshape(n, -1), None


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """float16 bytes of ``values [n, nb]`` as ``[n, nb, 2]`` uint8 (in the host's byte order, as the kernels read them)."""
    return values.to(torch.float16).contiguous().view(torch.uint8).view(*values.shape, 2)


def _fits_half(values: torch.Tensor, allow_zero: bool = False) -> bool:
    mags = values.abs()
    small = (mags > 0) & (mags < _HALF_NORMAL) if allow_zero else mags < _HALF_NORMAL
    return bool((mags <= _HALF_MAX).all()) and not bool(small.any())


def _none(weight: IntWeight, reason: str) -> None:
    logger.info("[%d, %d] %d-bit weight runs the SDK reference: %s", weight.rows, weight.cols, weight.bits, reason)
    return None
