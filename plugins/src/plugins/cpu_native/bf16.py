"""bfloat16 weights at load (``--quantization bf16``) for the native CPU kernels' ``linear_bf16w``.

Each weight is rounded to bfloat16 once and packed in the layout of native/src/bf16_tile.h:
groups of 64 output rows (zero rows past the last), each group ``[in/2 k-pairs][64 rows][2]``.
A call rounds the activations to bfloat16 as well and sums the products in float32
(``vdpbf16ps``), so ``y = bf16(x) @ bf16(W)^T + b`` in float32, the output in ``x``'s dtype:
float32 models keep their float32 residual stream, norms and attention, and only the
products' inputs are rounded (oneDNN's bf16 "fpmath mode"; torch's
``set_float32_matmul_precision("medium")``). Needs a library variant with AVX512_BF16
(``linear_bf16w_ready``); :func:`reference_bf16_linear` is the result it must give.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from plugins.errors import UnsupportedFeature

#: output rows of a packed group (native/src/bf16_tile.h: kOpW)
GROUP_ROWS = 64
#: ``act`` codes of native ``linear_bf16w`` by GELU's ``approximate``: None (no activation), ``"none"``
#: (GELU with erf), ``"tanh"`` (tanh-approximated GELU)
GELU_CODES = {None: 0, "none": 1, "tanh": 2}


@dataclass(frozen=True)
class Bf16Weight:
    """A linear weight rounded to bfloat16 and packed for ``linear_bf16w`` (:func:`pack_bf16`)."""

    packed: torch.Tensor
    out_features: int
    in_features: int
    #: ``packed``'s data pointer, taken once for the kernel calls
    data_ptr: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_ptr", self.packed.data_ptr())

    def unpacked(self) -> torch.Tensor:
        """The bfloat16 ``[out, in]`` matrix the packing holds (for checks)."""
        groups, pairs = self.packed.shape[:2]
        rows = self.packed.view(torch.bfloat16).view(groups, pairs, GROUP_ROWS, 2).permute(0, 2, 1, 3)
        return rows.reshape(groups * GROUP_ROWS, 2 * pairs)[: self.out_features]


def pack_bf16(weight: torch.Tensor) -> Bf16Weight:
    """``weight [out, in]`` rounded to bfloat16 (to nearest even) and packed in k-pairs x 64 rows.

    :raises UnsupportedFeature: ``in`` is not a multiple of 32 (the kernel rounds activations 32 at a time).
    """
    n, k = weight.shape
    if k % 32:
        raise UnsupportedFeature(f"bf16 weights need in_features a multiple of 32, got [{n}, {k}]")
    rows = F.pad(weight.detach().to(torch.bfloat16), (0, 0, 0, -n % GROUP_ROWS))
    groups = rows.shape[0] // GROUP_ROWS
    pairs = rows.view(groups, GROUP_ROWS, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    return Bf16Weight(pairs.view(torch.int32).view(groups, k // 2, GROUP_ROWS), n, k)


def reference_bf16_linear(
    x: torch.Tensor, weight: Bf16Weight, bias: torch.Tensor | None = None, gelu: str | None = None
) -> torch.Tensor:
    """What ``linear_bf16w`` computes: the float32 product of the bfloat16-rounded activations and
    weights, plus the bias, through GELU unless ``gelu`` (its ``approximate``) is None, in ``x``'s dtype."""
    out = F.linear(x.to(torch.bfloat16).float(), weight.unpacked().float(), None if bias is None else bias.float())
    if gelu is not None:
        out = F.gelu(out, approximate=gelu)
    return out.to(x.dtype)


def bf16_linear(
    lib: Any,
    x: torch.Tensor,
    weight: Bf16Weight,
    bias: torch.Tensor | None,
    gelu: str | None,
    num_threads: int,
    dtype_code: int,
    bias_arg: tuple[int | None, int],
) -> torch.Tensor:
    """``x @ W^T + bias`` through the native kernel, then GELU unless ``gelu`` (its ``approximate``)
    is None (``x`` 2-D, rows of unit stride; ``dtype_code`` and ``bias_arg`` as
    :mod:`plugins.cpu_native.linear` gives them)."""
    rows = x.shape[0]
    out = x.new_empty((rows, weight.out_features))
    status = lib.linear_bf16w(
        weight.data_ptr, weight.out_features, weight.in_features, dtype_code, x.data_ptr(), x.stride(0), rows,
        out.data_ptr(), *bias_arg, GELU_CODES[gelu], num_threads,
    )  # fmt: skip
    if status == -2:
        raise UnsupportedFeature("this kernel library variant has no linear_bf16w (it needs AVX512_BF16)")
    if status:
        raise MemoryError(
            f"linear_bf16w could not allocate its bfloat16 copy of {rows}x{weight.in_features} activations"
        )
    return out
