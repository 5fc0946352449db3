"""Weights from little-endian files for a big-endian host (s390x).

GGUF and safetensors store every multi-byte number little-endian. A platform whose
kernels read memory big-endian sets :attr:`plugins.Platform.byte_order` to ``"big"``
(plugin_s390x); core's GGUF loader then passes each tensor's raw bytes through
:func:`to_host_order`, which swaps the bytes of every multi-byte field in place of the
file's order: whole elements of a plain dtype, and the float16 scale fields inside
GGUF's quantized blocks (their int8 and 4-bit values are single bytes and stay as they
are). Safetensors files need no hook: the safetensors reader itself swaps to the host's
order when ``sys.byteorder`` is ``"big"``.

The conversion is numpy's: it takes a numpy array or a (CPU) torch tensor, and needs torch
only for a tensor, so a host without torch (s390x: PyPI has no wheel for it) runs this very
code on the bytes numpy reads (scripts/s390x_byteorder.py under qemu, `make test-cross`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    import torch

Raw = TypeVar("Raw", "np.ndarray", "torch.Tensor")

#: GGUF block formats: (bytes per block, offsets of its f16 fields). Other multi-byte fields
#: (Q5_0/Q5_1's 32 high bits) stay in the file's order: :mod:`plugins.gguf_quants` reads them byte by byte.
GGUF_BLOCK_FIELDS = {
    "Q8_0": (34, (0,)),
    "Q4_0": (18, (0,)),
    "Q4_1": (20, (0, 2)),
    "Q5_0": (22, (0,)),
    "Q5_1": (24, (0, 2)),
    "Q4_K": (144, (0, 2)),
    "Q5_K": (176, (0, 2)),
    "Q6_K": (210, (208,)),
}
#: plain element formats: bytes per element
ELEMENT_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I8": 1, "I16": 2, "I32": 4, "I64": 8, "F64": 8}


def to_host_order(raw: Raw, fmt: str, byte_order: str) -> Raw:
    """The little-endian bytes ``raw`` (uint8) of format ``fmt`` in ``byte_order``.

    :param raw: a tensor's bytes as the file holds them (any shape; uint8), as a numpy array
        or a CPU torch tensor; the result is of the same kind.
    :param fmt: a GGUF block format of :data:`GGUF_BLOCK_FIELDS` or an element format of
        :data:`ELEMENT_BYTES` (GGUF type names; safetensors' dtype names are the same).
    :param byte_order: ``"little"`` (returns ``raw`` itself) or ``"big"`` (a swapped copy).
    :raises ValueError: unknown ``byte_order``, a format with no known byte layout, or a
        size that is not a whole number of its blocks/elements.
    """
    if byte_order not in ("little", "big"):
        raise ValueError(f"byte order {byte_order!r} is not 'little' or 'big'")
    array = _as_array(raw)
    if byte_order == "little" or ELEMENT_BYTES.get(fmt) == 1:
        return raw
    swapped = _swapped(array, fmt)
    if isinstance(raw, np.ndarray):
        return swapped
    import torch

    return torch.from_numpy(swapped)


def _as_array(raw: Raw) -> np.ndarray:
    """``raw``'s bytes as a numpy array (a tensor's shares its memory)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raise ValueError(f"expected the raw bytes as uint8, got {raw.dtype}")
        return raw
    import torch

    if raw.dtype != torch.uint8:
        raise ValueError(f"expected the raw bytes as uint8, got {raw.dtype}")
    return raw.numpy()


def _swapped(raw: np.ndarray, fmt: str) -> np.ndarray:
    """A copy of the little-endian bytes ``raw`` with each multi-byte field of ``fmt`` reversed."""
    if fmt in GGUF_BLOCK_FIELDS:
        size, fields = GGUF_BLOCK_FIELDS[fmt]
        blocks = _rows_of(raw, size, fmt).copy()
        for offset in fields:
            blocks[:, [offset, offset + 1]] = blocks[:, [offset + 1, offset]]
        return blocks.reshape(raw.shape)
    if fmt in ELEMENT_BYTES:
        size = ELEMENT_BYTES[fmt]
        return _rows_of(raw, size, fmt)[:, ::-1].copy().reshape(raw.shape)
    known = ", ".join([*GGUF_BLOCK_FIELDS, *ELEMENT_BYTES])
    raise ValueError(f"no big-endian conversion for weight format {fmt!r}; known: {known}")


def _rows_of(raw: np.ndarray, size: int, fmt: str) -> np.ndarray:
    if raw.size % size:
        raise ValueError(f"{raw.size} bytes are not a whole number of {fmt} units of {size} bytes")
    return raw.reshape(-1, size)
