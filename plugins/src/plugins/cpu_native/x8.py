"""The x8 layout of the int8-activation kernel (native/src/quant.cpp): weight rows in groups of 8,
multiplied with int8 activations, or with int16 ones as two int8 halves (the default path).

Q8_0, Q4_0, Q4_1 and per-row int8 weights are repacked as their blocks are. The K-quants
and the 5-bit formats are first rewritten as blocks of 32 with float32 scales
(:func:`float_scaled_rows`, their values unchanged up to float32 rounding), because their
scales belong to 256-value super-blocks (Q4_K, Q5_K, Q6_K) or their 5-bit codes take a byte
anyway (Q5_0, Q5_1):

- ``Q4FX8`` (Q4_K): float32 ``d``, ``m``, 16 bytes of nibbles as Q4_1 (value ``d * q + m``);
- ``U8FX8`` (Q5_0, Q5_1, Q5_K): float32 ``d``, ``m``, 32 code bytes 0..31;
- ``S8FX8`` (Q6_K): float32 ``d0``, ``d1``, 32 signed code bytes (``d0 * q`` for values 0-15,
  ``d1 * q`` for 16-31).
"""

from __future__ import annotations

import torch
from plugins.cpu_native.library import (
    INT8,
    Q4_0,
    Q4_1,
    Q4_K,
    Q4FX8,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    S8FX8,
    U8FX8,
    X8,
)
from plugins.gguf_quants import affine_codes

GROUP = 8  # rows interleaved by interleave_x8
#: row format code -> the code of its x8 form
X8_CODES = {
    Q8_0: Q8_0 + X8, Q4_0: Q4_0 + X8, Q4_1: Q4_1 + X8, INT8: INT8 + X8,
    Q4_K: Q4FX8, Q5_0: U8FX8, Q5_1: U8FX8, Q5_K: U8FX8, Q6_K: S8FX8,
}  # fmt: skip
#: x8 code -> (bytes of a row's block of 32, bytes of one of its scales, number of scales)
_LAYOUT = {
    Q8_0 + X8: (34, 2, 1), Q4_0 + X8: (18, 2, 1), Q4_1 + X8: (20, 2, 2), INT8 + X8: (32, 0, 0),
    Q4FX8: (24, 4, 2), U8FX8: (40, 4, 2), S8FX8: (40, 4, 2),
}  # fmt: skip
FLOAT_SCALED = (Q4FX8, U8FX8, S8FX8)


def float_scaled_rows(fmt: str, code: int, data: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """GGUF rows of ``fmt`` as the blocks of float-scaled x8 ``code``, one row of blocks a weight row (uint8)."""
    q, scale, offset = affine_codes(fmt, data, rows, cols)
    nb = cols // 32
    heads = scale if code == S8FX8 else torch.stack([scale[..., 0], offset], -1)  # [rows, nb, 2]
    codes = q.reshape(rows, nb, 32)
    if code == Q4FX8:  # byte j: value j in the low nibble, j + 16 in the high one
        codes = codes[..., :16] | (codes[..., 16:] << 4)
    body = codes.contiguous().view(torch.uint8)
    return torch.cat([heads.float().contiguous().view(torch.uint8), body], -1).reshape(rows, -1)


def float_scaled_values(code: int, rows: torch.Tensor) -> torch.Tensor:
    """float32 values of :func:`float_scaled_rows`' blocks ``[n, nb * bytes]``."""
    n, nb = rows.shape[0], rows.shape[1] // _LAYOUT[code][0]
    blocks = rows.reshape(n, nb, -1)
    heads = blocks[..., :8].contiguous().view(torch.float32)  # [n, nb, 2]
    if code == Q4FX8:
        q = torch.cat([blocks[..., 8:] & 0x0F, blocks[..., 8:] >> 4], -1).float()
    else:
        q = blocks[..., 8:].contiguous().view(torch.int8 if code == S8FX8 else torch.uint8).float()
    if code == S8FX8:
        values = q.view(n, nb, 2, 16) * heads[..., None]
    else:
        values = q * heads[..., :1] + heads[..., 1:]
    return values.reshape(n, nb * 32)


def interleave_x8(rows: torch.Tensor, code: int) -> torch.Tensor:
    """Repack ``[n, nb * block]`` bytes of rows for x8 ``code`` into native/src/quant.cpp's x8 layout.

    Rows go in groups of 8 (the last padded with zero rows); in each group and block of 32
    columns, first the 8 rows' scales side by side (all d, then all m), then the values 4
    bytes of a row at a time: chunk 0 of rows 0..7, chunk 1 of rows 0..7, ... The result is
    ``[ceil(n / 8), nb * 8 * block]`` bytes, of ``rows``' dtype (uint8 or int8).
    """
    n, width = rows.shape
    block, unit, count = _LAYOUT[code]
    sb = unit * count
    nb, groups = width // block, -(-n // GROUP)
    padded = torch.zeros(groups * GROUP, width, dtype=rows.dtype)
    padded[:n] = rows
    blocks = padded.view(groups, GROUP, nb, block)
    scales = blocks[..., :sb].reshape(groups, GROUP, nb, count, unit).permute(0, 2, 3, 1, 4)
    values = blocks[..., sb:].reshape(groups, GROUP, nb, (block - sb) // 4, 4).permute(0, 2, 3, 1, 4)
    packed = torch.cat([scales.reshape(groups, nb, GROUP * sb), values.reshape(groups, nb, GROUP * (block - sb))], 2)
    return packed.reshape(groups, -1).contiguous()


def deinterleave_x8(packed: torch.Tensor, code: int, n: int) -> torch.Tensor:
    """The ``[n, nb * block]`` rows that :func:`interleave_x8` packed."""
    groups = packed.shape[0]
    block, unit, count = _LAYOUT[code]
    sb = unit * count
    nb = packed.shape[1] // (GROUP * block)
    parts = packed.view(groups, nb, GROUP * block)
    scales = parts[..., : GROUP * sb].reshape(groups, nb, count, GROUP, unit).permute(0, 3, 1, 2, 4)
    values = parts[..., GROUP * sb :].reshape(groups, nb, (block - sb) // 4, GROUP, 4).permute(0, 3, 1, 2, 4)
    blocks = torch.cat([scales.reshape(groups, GROUP, nb, sb), values.reshape(groups, GROUP, nb, block - sb)], 3)
    return blocks.reshape(groups * GROUP, nb * block)[:n].contiguous()
