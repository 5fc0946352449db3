"""Mixture-of-experts on the CPU plugins: experts packed once at load (:func:`pack_experts`), a
batch's expert products in one native call (native/src/moe.cpp, :func:`native_fused_moe`).

Each expert's gate, up and down projections are prepared as a dense linear's weight is
(:meth:`plugins.cpu_native.linear.QuantLinearMixin.prepare_linear`), then each projection of all
experts is stacked into one tensor, expert after expert, so the kernel finds any block of rows of
any expert by arithmetic. An expert's gate and up rows are stored together, gate then up: where the
intermediate size is a whole number of the format's row groups the kernel multiplies both in one
call (one weight stream, one quantization of the activations). With ``CPU_MOE_PREPACK`` (the default) GGUF blocks are repacked in
groups of 8 rows for the int16-activation kernel (the dense linears' default), bfloat16 experts
packed in 64-row tiles for ``linear_bf16w`` (library variants with AVX512_BF16) and float32 ones
kept as they are; ``CPU_MOE_PREPACK=0`` computes experts as stored: GGUF blocks in the file's
layout (float32 activations), float32 rows natively, bfloat16 ones by the SDK's grouped default
(``--quantization int8`` or ``bf16`` then leaves the experts as they came).
Experts the native kernel cannot take (projection inputs not a multiple of 32, other formats)
stay as loaded and run the SDK's grouped default.
"""

from __future__ import annotations

import ctypes
from ctypes import Structure, c_int, c_long, c_void_p
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from plugins.cpu_native.bf16 import GROUP_ROWS, Bf16Weight, pack_bf16
from plugins.cpu_native.library import F32W
from plugins.cpu_native.linear import NATIVE_DTYPES, QuantizedWeight, gguf_weight
from plugins.cpu_native.x8 import GROUP
from plugins.kernels import GGUFWeight
from plugins.moe import ExpertWeights

#: an expert projection packed for ``linear_bf16w`` (native/src/moe.h: CK_MOE_BF16W)
BF16W = 18


class _ProjectionLayout(Structure):
    _fields_ = [
        ("w", c_void_p), ("scales", c_void_p), ("expert_bytes", c_long), ("scale_stride", c_long),
        ("row_bytes", c_long), ("n", c_long), ("k", c_long), ("group", c_long), ("qt", c_int),
    ]  # fmt: skip


class ExpertsLayout(Structure):
    """native/src/moe.h's CKExperts (the fused decoder's MoE layers point at one)."""

    _fields_ = [
        ("gate", _ProjectionLayout),
        ("up", _ProjectionLayout),
        ("down", _ProjectionLayout),
        ("num_experts", c_long),
    ]


@dataclass(frozen=True)
class PackedProjection:
    """One projection of every expert: ``data [E, ...]``, each expert's ``parts`` parts (gate and up:
    2) of ``out_features`` rows each in format ``code`` (a ``linear`` code with its flags, or
    :data:`BF16W`), each part padded to whole ``group``s of rows; ``scales [E, parts * padded rows]``
    for the int8 formats, else None."""

    data: torch.Tensor
    scales: torch.Tensor | None
    code: int
    out_features: int
    in_features: int
    group: int
    parts: int = 1

    def native(self, part: int = 0) -> _ProjectionLayout:
        """The kernel's description of part ``part`` (pointers into :attr:`data` and :attr:`scales`)."""
        num_experts = self.data.shape[0]
        expert_bytes = self.data.numel() * self.data.element_size() // num_experts
        padded = -(-self.out_features // self.group) * self.group
        if expert_bytes % (self.parts * padded):
            raise ValueError(
                f"expert weights of {expert_bytes} bytes are not {self.parts} x {padded} rows of equal size"
            )
        row_bytes = expert_bytes // (self.parts * padded)
        w = self.data.data_ptr() + part * padded * row_bytes
        scales, stride = (None, 0)
        if self.scales is not None:
            scales = self.scales.data_ptr() + part * padded * self.scales.element_size()
            stride = self.scales.shape[1]
        return _ProjectionLayout(w, scales, expert_bytes, stride, row_bytes, self.out_features, self.in_features,
                                 self.group, self.code)  # fmt: skip


@dataclass(frozen=True)
class NativeExperts:
    """A MoE layer's experts as :func:`pack_experts` packed them for native/src/moe.cpp."""

    gate_up: PackedProjection  # 2 parts: gate, up
    down: PackedProjection
    num_experts: int
    #: the kernel's description, built once
    native: ExpertsLayout = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        gate, up = self.gate_up.native(0), self.gate_up.native(1)
        object.__setattr__(self, "native", ExpertsLayout(gate, up, self.down.native(), self.num_experts))

    @property
    def hidden_size(self) -> int:
        return self.down.out_features

    @property
    def intermediate_size(self) -> int:
        return self.gate_up.out_features


def _rows(weight: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of a matrix: a tensor, or a ``GGUFWeight`` (whose rows are quantized one by one)."""
    if isinstance(weight, torch.Tensor):
        return weight[start:stop]
    return GGUFWeight(weight.qtype, weight.data[start:stop], stop - start, weight.cols)


def _prepare(kernels: Any, weight: Any, quantization: str | None, prepack: bool) -> Any:
    """One expert projection prepared as a dense linear's weight, or as stored without ``prepack``."""
    if not prepack:
        return gguf_weight(weight) if isinstance(weight, GGUFWeight) else weight
    if quantization is None and isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16:
        return pack_bf16(weight) if kernels.lib.linear_bf16w_ready() else weight
    return kernels.prepare_linear(weight, quantization)


def _stack(parts: list[Any]) -> PackedProjection | None:
    """Prepared projections of every expert (one format; each expert's a list of its parts, gate and
    up or down alone) as one :class:`PackedProjection`, or None when the native kernel does not take
    their format."""
    first, count = parts[0][0], len(parts[0])
    if isinstance(first, QuantizedWeight) and first.perm is None and first.fp8_activations is None:
        data = torch.stack([torch.cat([p.data.reshape(-1) for p in expert]) for expert in parts])
        scales = None if first.scales is None else torch.stack([torch.cat([p.scales for p in e]) for e in parts])
        return PackedProjection(data, scales, first.call_code, first.out_features, first.in_features,
                                GROUP if first.interleaved else 1, count)  # fmt: skip
    if isinstance(first, Bf16Weight):
        packed = torch.stack([torch.cat([p.packed.reshape(-1) for p in expert]) for expert in parts])
        return PackedProjection(packed, None, BF16W, first.out_features, first.in_features, GROUP_ROWS, count)
    if isinstance(first, torch.Tensor) and first.dtype == torch.float32:
        rows, cols = first.shape
        data = torch.stack([torch.cat([p.reshape(-1) for p in expert]) for expert in parts])
        return PackedProjection(data, None, F32W, rows, cols, 1, count)
    return None


def pack_experts(kernels: Any, experts: ExpertWeights, quantization: str | None, prepack: bool) -> NativeExperts | None:
    """``experts`` packed for the native kernel (see the module docstring), or None where it does
    not take them (the caller keeps them for the SDK's grouped default)."""
    inter, num = experts.intermediate_size, experts.num_experts
    first_down = experts.stored("down", 0)
    hidden = first_down.shape[0] if isinstance(first_down, torch.Tensor) else first_down.rows
    if hidden % 32 or inter % 32:  # the linears' kernels take whole blocks of 32 inputs
        return None
    gate_up: list[list[Any]] = []
    down: list[list[Any]] = []
    for index in range(num):
        stored = experts.stored("gate_up", index)
        gate_up.append([_prepare(kernels, _rows(stored, start, start + inter), quantization, prepack)
                        for start in (0, inter)])  # fmt: skip
        down.append([_prepare(kernels, experts.stored("down", index), quantization, prepack)])
    packed_gate_up, packed_down = _stack(gate_up), _stack(down)
    if packed_gate_up is None or packed_down is None:
        return None
    # a decode step streams the active experts' rows: in transparent huge pages, as the dense
    # linears' repacked weights (kernels.weight_arena), not in the 4 KiB pages torch.stack made
    arena = kernels.weight_arena
    packed_gate_up, packed_down = (replace(p, data=arena.copy(p.data)) for p in (packed_gate_up, packed_down))
    return NativeExperts(packed_gate_up, packed_down, num)


def native_fused_moe(
    lib: Any, experts: NativeExperts, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
    num_threads: int,
) -> torch.Tensor:  # fmt: skip
    """``Kernels.fused_moe`` on packed experts (native/src/moe.cpp): float32 math, ``x``'s dtype out.

    :raises ValueError: for inputs of the wrong shape; :raises IndexError: for an expert id out of range.
    """
    if x.dim() != 2 or x.shape[1] != experts.hidden_size:
        raise ValueError(f"fused_moe takes x [tokens, {experts.hidden_size}], got {list(x.shape)}")
    if topk_ids.shape != topk_weights.shape or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"fused_moe takes topk_weights and topk_ids [{x.shape[0]}, top_k], got {list(topk_weights.shape)} "
            f"and {list(topk_ids.shape)}"
        )
    rows = x if x.dtype in NATIVE_DTYPES else x.float()
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    weights = topk_weights.to(torch.float32).contiguous()
    ids = topk_ids.to(torch.int64).contiguous()
    out = rows.new_empty(rows.shape)
    status = lib.fused_moe(
        ctypes.byref(experts.native), NATIVE_DTYPES[rows.dtype], rows.data_ptr(), rows.stride(0), rows.shape[0],
        weights.data_ptr(), ids.data_ptr(), ids.shape[1], out.data_ptr(), num_threads,
    )  # fmt: skip
    if status == -2:
        raise IndexError(f"topk_ids has an expert id outside 0..{experts.num_experts - 1}")
    if status:
        raise MemoryError(f"the native fused_moe could not allocate its buffers for {x.shape[0]} tokens")
    return out.to(x.dtype)
