"""Reference dequantization of GGUF block formats in torch, on any device.

Each format packs a row of ``cols`` weights into blocks of ``block_size`` values and
``type_size`` bytes; :func:`dequantize` turns the raw uint8 rows of a
:class:`plugins.kernels.GGUFWeight` back into float32, bit for bit as the ``gguf``
package (and llama.cpp) does: the same float32 operations in the same order.

Formats: the legacy ``Q8_0``, ``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1`` (32 values a block)
and the K-quants ``Q4_K``, ``Q5_K``, ``Q6_K`` (256-value super-blocks of 8 or 16
sub-blocks, each with its own 6- or 8-bit scale).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from plugins.errors import UnsupportedFeature

QK_K = 256


def _f16(raw: torch.Tensor) -> torch.Tensor:
    """float16 scalars stored as 2 bytes at the end dimension -> float32 ``[..., 1]``."""
    return raw.contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor, group: int) -> torch.Tensor:
    """Bytes ``[n, k * group]`` -> 4-bit values ``[n, k, 2 * group]``: low nibbles first, then high ones."""
    qs = qs.reshape(qs.shape[0], -1, 1, group)
    shifts = torch.tensor([0, 4], dtype=torch.uint8, device=qs.device).reshape(1, 1, 2, 1)
    return ((qs >> shifts) & 0x0F).reshape(qs.shape[0], -1, 2 * group)


def _bits(qh: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """``width``-bit fields of each byte, lowest first: ``[n, m]`` -> ``[n, count, m]`` (count * width = 8)."""
    shifts = torch.arange(0, count * width, width, dtype=torch.uint8, device=qh.device).reshape(1, count, 1)
    return (qh.unsqueeze(1) >> shifts) & ((1 << width) - 1)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 16).reshape(b.shape[0], 32).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 16).reshape(b.shape[0], 32).float()
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5_high(qh: torch.Tensor) -> torch.Tensor:
    """The fifth bits of a 32-value block: a little-endian uint32 -> ``[n, 32]`` of 0/1, shifted to bit 4."""
    bits = _bits(qh, 8, 1).transpose(1, 2).reshape(qh.shape[0], 32)  # bit j of byte i is value 8 * i + j
    return bits << 4


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of a Q4_K/Q5_K super-block, packed in 12 bytes."""
    d, m, m_d = scales.reshape(-1, 3, 4).unbind(1)
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc.float().unsqueeze(-1), mins.float().unsqueeze(-1)


def _affine_q5(b: torch.Tensor, with_min: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q5_1 (``with_min``: f16 d, m, then the high bits) or Q5_0 (f16 d, then the high bits; m = -16 d)."""
    qh = 4 if with_min else 2
    q = _nibbles(b[:, qh + 4 :], 16).reshape(b.shape[0], 32) | _q5_high(b[:, qh : qh + 4])
    d = _f16(b[:, :2])
    return q, d, _f16(b[:, 2:4]) if with_min else -16.0 * d


def _affine_k(b: torch.Tensor, five_bits: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sc, mins = _k_scales(b[:, 4:16])
    d, dm = _f16(b[:, :2]).unsqueeze(-1) * sc, _f16(b[:, 2:4]).unsqueeze(-1) * mins
    q = _nibbles(b[:, 48 if five_bits else 16 :], 32).reshape(b.shape[0], 8, 32)
    if five_bits:
        q = q | (_bits(b[:, 16:48], 8, 1) << 4)
    return q.reshape(-1, 32), d.reshape(-1, 1), -dm.reshape(-1, 1)


def _affine_q6_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = b.shape[0]
    low = _nibbles(b[:, :128].reshape(n * 2, 64), 64).reshape(n, 8, 32)
    high = _bits(b[:, 128:192].reshape(n * 2, 32), 4, 2).reshape(n, 8, 32)
    q = (low | (high << 4)).to(torch.int8) - 32
    d = _f16(b[:, 208:210]) * b[:, 192:208].contiguous().view(torch.int8).float()
    return q.reshape(-1, 32), d.reshape(-1, 2), torch.zeros(n * 8, 1)


def _q5_0(b: torch.Tensor) -> torch.Tensor:  # d * (q - 16), rounded as the reference (not d * q - 16 d)
    q, d, _ = _affine_q5(b, False)
    return d * (q.to(torch.int8) - 16).float()


def _from_affine(codes: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """The block dequantizer of a format whose values are ``scale * code + offset`` (the
    reference's float32 operations: ``d * q + m``, ``d * q - dmin * min``, ``d * (q - 32)``)."""

    def blocks(b: torch.Tensor) -> torch.Tensor:
        q, scale, offset = codes(b)
        n = q.shape[0]
        values = q.float().view(n, 2, 16) * scale.expand(n, 2).unsqueeze(-1)
        return (values.view(n, 32) + offset).reshape(b.shape[0], -1)

    return blocks


#: qtype -> blocks -> (codes [blocks of 32, 32], scales [.., 1 or 2 halves], offsets [.., 1])
_AFFINE: dict[str, Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
    "Q5_0": lambda b: _affine_q5(b, False),
    "Q5_1": lambda b: _affine_q5(b, True),
    "Q4_K": lambda b: _affine_k(b, False),
    "Q5_K": lambda b: _affine_k(b, True),
    "Q6_K": _affine_q6_k,
}


def affine_codes(
    qtype: str, data: torch.Tensor, rows: int, cols: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of ``qtype`` (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) as ``scale * code + offset`` per block of 32.

    Returns the integer codes ``[rows, cols]`` (uint8, or int8 for Q6_K: ``q - 32``), the
    float32 scales ``[rows, cols // 32, 2]`` (of values 0-15 and 16-31 of a block: the same
    but for Q6_K, which scales every 16) and offsets ``[rows, cols // 32]``. The values are
    :func:`dequantize`'s up to float32 rounding (e.g. Q5_0's ``d * q - 16 d`` for ``d * (q - 16)``).
    """
    row_bytes(qtype, cols)  # raises for a format without codes or a partial block
    if qtype not in _AFFINE:
        raise UnsupportedFeature(f"GGUF {qtype} has no affine codes here; supported: {sorted(_AFFINE)}")
    _, size, _ = FORMATS[qtype]
    q, scale, offset = _AFFINE[qtype](data.reshape(-1, size))
    nb = cols // 32
    return q.reshape(rows, cols), scale.expand(-1, 2).reshape(rows, nb, 2), offset.reshape(rows, nb)


#: qtype -> (values per block, bytes per block, block dequantizer)
FORMATS: dict[str, tuple[int, int, Callable[[torch.Tensor], torch.Tensor]]] = {
    "Q8_0": (32, 34, _q8_0),
    "Q4_0": (32, 18, _q4_0),
    "Q4_1": (32, 20, _q4_1),
    "Q5_0": (32, 22, _q5_0),
    "Q5_1": (32, 24, _from_affine(_AFFINE["Q5_1"])),
    "Q4_K": (QK_K, 144, _from_affine(_AFFINE["Q4_K"])),
    "Q5_K": (QK_K, 176, _from_affine(_AFFINE["Q5_K"])),
    "Q6_K": (QK_K, 210, _from_affine(_AFFINE["Q6_K"])),
}


def row_bytes(qtype: str, cols: int) -> int:
    """Bytes of one row of ``cols`` values in ``qtype``.

    :raises UnsupportedFeature: for a format not in :data:`FORMATS`.
    :raises ValueError: when ``cols`` is not a whole number of blocks.
    """
    if qtype not in FORMATS:
        raise UnsupportedFeature(f"GGUF type {qtype!r} has no reference dequantization; supported: {sorted(FORMATS)}")
    block, size, _ = FORMATS[qtype]
    if cols % block:
        raise ValueError(f"GGUF {qtype} rows hold whole blocks of {block} values; got {cols} columns")
    return cols // block * size


def dequantize(qtype: str, data: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float32 ``[rows, cols]`` from the raw uint8 bytes of ``rows`` rows in ``qtype``.

    :raises ValueError: when ``data`` does not hold exactly ``rows`` rows of ``cols`` values.
    """
    expected = rows * row_bytes(qtype, cols)
    if data.dtype != torch.uint8 or data.numel() != expected:
        raise ValueError(
            f"GGUF {qtype} [{rows}, {cols}] needs {expected} uint8 bytes, got {data.numel()} of {data.dtype}"
        )
    _, size, blocks = FORMATS[qtype]
    return blocks(data.reshape(-1, size)).reshape(rows, cols)
