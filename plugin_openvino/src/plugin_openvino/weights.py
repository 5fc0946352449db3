"""Linear products as OpenVINO graph nodes: dense weights, or GGUF blocks as compressed weights.

OpenVINO's CPU plugin runs ``Constant(u4/u8/i8) -> Convert(f16) -> [Subtract zero point]
-> Multiply(f16 scale) -> Reshape -> Convert(f32)`` in front of a ``MatMul`` as one
compressed-weight product (the pattern openvino-genai's GGUF reader builds). GGUF's 32-value
blocks map onto it, their f16 scales kept as they are:

- ``Q8_0`` (``w = d * q``, q int8): i8 codes, one scale per block;
- ``Q4_0`` (``w = d * (q - 8)``, q 4-bit): u4 codes, zero point 8;
- ``Q4_1`` (``w = d * q + m``), in one of three forms (:data:`Q4_1_FORMS`):
  ``f16``: u4 codes, zero point ``-m / d`` in f16 (within 2^-11 of a step of the exact one; a
  block with ``d == 0`` holds ``m`` everywhere: codes 1, scale ``m``, zero point 0);
  ``split``: u4 codes times ``d`` with no zero point, plus a second, small product
  ``blocksums(x) @ m.T`` (exact: OpenVINO's CPU plugin runs int8 activations only into products
  with integer zero points, and this one has none); ``round``: zero points rounded to 4-bit
  integers as openvino-genai's GGUF reader does, which moves every weight of a block by up to
  half a step (not the file's model).

GGUF packs element ``j`` and ``j + 16`` of a block in one byte; OpenVINO's u4 packs
elements ``2i`` and ``2i + 1``: the nibbles are reordered once here. The constants share
the memory of the torch tensors kept alongside them, which must outlive the model.
"""

from __future__ import annotations

from typing import Any

import torch
from plugins.kernels import GGUFWeight

#: GGUF types kept compressed; others are dequantized to dense constants
COMPRESSED_GGUF = frozenset({"Q8_0", "Q4_0", "Q4_1"})
#: the forms of a Q4_1 product (see the module docstring): "f16" zero points, "split" (exact,
#: int8 activations run its main product), "round" (openvino-genai's integer zero points, not exact)
Q4_1_FORMS = ("f16", "split", "round")
_BLOCK = 32


def ov_tensor(t: torch.Tensor, ov_type: Any = None, shape: list[int] | None = None) -> Any:
    """An ``ov.Tensor`` over ``t``'s memory (contiguous, on the CPU), typed ``ov_type`` (default: ``t``'s)."""
    import openvino as ov

    if not t.is_contiguous():
        raise ValueError("ov_tensor needs a contiguous tensor")
    ov_type = ov_type or OV_TYPES[t.dtype]()
    raw = t.view(-1).view(torch.uint8).numpy() if t.numel() else t.numpy()
    return ov.Tensor(raw, list(t.shape) if shape is None else shape, ov_type)


def _types():
    import openvino as ov

    return {
        torch.float32: lambda: ov.Type.f32,
        torch.bfloat16: lambda: ov.Type.bf16,
        torch.float16: lambda: ov.Type.f16,
        torch.int8: lambda: ov.Type.i8,
        torch.uint8: lambda: ov.Type.u8,
        torch.int32: lambda: ov.Type.i32,
        torch.int64: lambda: ov.Type.i64,
    }


OV_TYPES = _types()


def constant(t: torch.Tensor, keep: list[torch.Tensor], ov_type: Any = None, shape: list[int] | None = None) -> Any:
    """A Constant sharing ``t``'s memory; ``t`` is appended to ``keep`` (it must stay alive)."""
    import openvino as ov

    t = t.contiguous()
    keep.append(t)
    return ov.op.Constant(ov_tensor(t, ov_type, shape), shared_memory=True)


def _repack_u4(codes: torch.Tensor) -> torch.Tensor:
    """``[rows, blocks, 16]`` GGUF nibble bytes -> ``[rows, blocks, 16]`` bytes in OpenVINO's u4 order."""
    values = torch.cat([codes & 0x0F, codes >> 4], dim=-1)  # [rows, blocks, 32] in element order
    return (values[..., 0::2] | (values[..., 1::2] << 4)).contiguous()


def _f16(raw: torch.Tensor) -> torch.Tensor:
    return raw.contiguous().view(torch.float16)


def _decompressed(codes: Any, zero: Any, scale: torch.Tensor, rows: int, cols: int, keep: list[torch.Tensor]) -> Any:
    """OpenVINO's compressed-weight pattern: ``(f16(codes) [- zero]) * scale`` as f32 ``[rows, cols]``."""
    import openvino as ov
    import openvino.opset13 as ops

    node = ops.convert(codes, ov.Type.f16)
    if zero is not None:
        node = ops.subtract(node, zero)
    node = ops.multiply(node, constant(scale, keep))
    return ops.convert(ops.reshape(node, ops.constant([rows, cols], ov.Type.i64), special_zero=False), ov.Type.f32)


def _u4_zero_points(zero: torch.Tensor) -> torch.Tensor:
    """``[rows, blocks, 1]`` zero points rounded into 0..15, as u4 bytes (two a byte, first low)."""
    codes = zero.float().round().clamp(0, 15).to(torch.uint8).flatten()
    if codes.numel() % 2:
        codes = torch.cat([codes, codes.new_zeros(1)])
    return (codes[0::2] | (codes[1::2] << 4)).contiguous()


def _compressed_matmul(x: Any, weight: GGUFWeight, keep: list[torch.Tensor], q4_1: str) -> Any:
    """``x @ w.T`` of a Q8_0/Q4_0/Q4_1 weight ``w`` kept compressed (see the module docstring)."""
    import openvino as ov
    import openvino.opset13 as ops

    rows, cols, qtype = weight.rows, weight.cols, weight.qtype
    nblocks = cols // _BLOCK
    data = weight.data.reshape(rows, nblocks, -1)
    scale = _f16(data[..., 0:2]).reshape(rows, nblocks, 1)
    zero = None
    if qtype == "Q8_0":
        codes = constant(data[..., 2:].contiguous().view(torch.int8), keep)
    elif qtype == "Q4_0":
        codes = constant(_repack_u4(data[..., 2:]), keep, ov.Type.u4, [rows, nblocks, _BLOCK])
        zero = ops.constant(8.0, ov.Type.f16)
    elif q4_1 == "split":  # d * q with no zero point, plus blocksums(x) @ m.T
        minimum = _f16(data[..., 2:4]).reshape(rows, nblocks)
        codes = constant(_repack_u4(data[..., 4:]), keep, ov.Type.u4, [rows, nblocks, _BLOCK])
        blocksums = ops.reduce_sum(
            ops.reshape(x, ops.constant([0, nblocks, _BLOCK], ov.Type.i64), special_zero=True),
            ops.constant([2], ov.Type.i64),
        )
        minimums = ops.convert(constant(minimum, keep), ov.Type.f32)
        return ops.add(
            ops.matmul(x, _decompressed(codes, None, scale, rows, cols, keep), False, True),
            ops.matmul(blocksums, minimums, False, True),
        )
    else:  # Q4_1
        minimum = _f16(data[..., 2:4]).reshape(rows, nblocks, 1)
        packed = _repack_u4(data[..., 4:])
        flat = scale == 0
        if bool(flat.any()):  # a block of one value m: codes 1 times scale m
            packed = torch.where(flat, torch.full_like(packed, 0x11), packed)
            scale = torch.where(flat, minimum, scale)
        zero_points = torch.where(flat, 0.0, -minimum.float() / scale.float())
        if q4_1 == "round":
            zero = ops.convert(
                constant(_u4_zero_points(zero_points), keep, ov.Type.u4, [rows, nblocks, 1]), ov.Type.f16
            )
        else:
            zero = constant(zero_points.half(), keep)
        codes = constant(packed, keep, ov.Type.u4, [rows, nblocks, _BLOCK])
    return ops.matmul(x, _decompressed(codes, zero, scale, rows, cols, keep), False, True)


def matmul_node(x: Any, weight: Any, keep: list[torch.Tensor], compress: bool, q4_1: str = "f16") -> Any:
    """``x @ weight.T`` of a linear's ``[out, in]`` weight, as a graph node of ``x``'s ``[T, in]`` f32.

    :param weight: a dense tensor or a :class:`GGUFWeight` (what the platform's kernels kept).
    :param compress: keep Q8_0/Q4_0/Q4_1 blocks compressed (else dequantize them).
    :param q4_1: the form of a Q4_1 weight (:data:`Q4_1_FORMS`).
    :raises TypeError: for a weight form the graph does not take (integer checkpoints).
    """
    import openvino as ov
    import openvino.opset13 as ops

    if isinstance(weight, GGUFWeight):
        if compress and weight.qtype in COMPRESSED_GGUF and weight.cols % _BLOCK == 0:
            if q4_1 not in Q4_1_FORMS:
                raise ValueError(f"Q4_1 form {q4_1!r}: choose from {', '.join(Q4_1_FORMS)}")
            return _compressed_matmul(x, weight, keep, q4_1)
        weight = weight.dequantize()
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(f"a {type(weight).__name__} weight")
    node = constant(weight, keep)
    return ops.matmul(x, node if weight.dtype == torch.float32 else ops.convert(node, ov.Type.f32), False, True)
