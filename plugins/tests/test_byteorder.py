"""plugins.byteorder: little-endian file bytes converted for a big-endian host.

The converted bytes are read back as big-endian numbers (numpy's ``>`` dtypes) and must
give the values the little-endian file held; in GGUF blocks only the f16 scale fields
may change (the quantized values must stay byte for byte).
"""

import numpy as np
import pytest
import torch
from plugins.byteorder import GGUF_BLOCK_FIELDS, to_host_order


@pytest.mark.parametrize("fmt, le, be", [("F32", "<f4", ">f4"), ("F16", "<f2", ">f2"), ("I32", "<i4", ">i4")])
def test_elements_read_back_big_endian(fmt, le, be):
    values = np.random.default_rng(0).standard_normal(48).astype(le) * 100
    raw = torch.from_numpy(values.view(np.uint8).copy()).reshape(6, -1)
    out = to_host_order(raw, fmt, "big")
    assert out.shape == raw.shape
    np.testing.assert_array_equal(out.numpy().reshape(-1).view(be), values.astype(be))


def test_bf16_elements_swapped():
    x = torch.randn(40).to(torch.bfloat16)
    raw = x.view(torch.uint8)
    out = to_host_order(raw, "BF16", "big").numpy().view(">u2")
    np.testing.assert_array_equal(out, x.view(torch.int16).numpy().astype(np.uint16))


@pytest.mark.parametrize("fmt", sorted(GGUF_BLOCK_FIELDS))
def test_gguf_blocks_swap_only_their_f16_fields(fmt):
    size, fields = GGUF_BLOCK_FIELDS[fmt]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=(7, 3 * size), dtype=np.uint8)
    for offset in fields:  # finite little-endian f16 scales
        raw.reshape(-1, size)[:, offset : offset + 2] = (
            rng.uniform(-1, 1, (raw.size // size, 1)).astype("<f2").view(np.uint8)
        )
    out = to_host_order(torch.from_numpy(raw), fmt, "big").numpy()
    blocks_in, blocks_out = raw.reshape(-1, size), out.reshape(-1, size)
    rest = [i for i in range(size) if not any(o <= i < o + 2 for o in fields)]
    np.testing.assert_array_equal(blocks_out[:, rest], blocks_in[:, rest])  # quantized values untouched
    for offset in fields:
        big = blocks_out[:, offset : offset + 2].copy().view(">f2")
        little = blocks_in[:, offset : offset + 2].copy().view("<f2")
        np.testing.assert_array_equal(big, little)


def test_little_endian_is_the_same_tensor():
    raw = torch.arange(8, dtype=torch.uint8)
    assert to_host_order(raw, "Q8_0", "little") is raw


@pytest.mark.parametrize(
    "raw, fmt, order, message",
    [
        (torch.zeros(34, dtype=torch.uint8), "IQ2_XS", "big", "no big-endian conversion for weight format 'IQ2_XS'"),
        (torch.zeros(35, dtype=torch.uint8), "Q8_0", "big", "35 bytes are not a whole number of Q8_0"),
        (torch.zeros(4, dtype=torch.uint8), "F32", "middle", "byte order 'middle'"),
        (torch.zeros(4, dtype=torch.float32), "F32", "big", "expected the raw bytes as uint8"),
        (np.zeros(4, dtype=np.float32), "F32", "big", "expected the raw bytes as uint8"),
    ],
)
def test_bad_input_names_the_problem(raw, fmt, order, message):
    with pytest.raises(ValueError, match=message):
        to_host_order(raw, fmt, order)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0", "F32", "I8"])
def test_numpy_arrays_convert_like_tensors(fmt):
    """The numpy path (a host without torch: scripts/s390x_byteorder.py on s390x) gives a
    numpy array with the tensor path's bytes, without touching its input."""
    raw = np.random.default_rng(2).integers(0, 256, size=(4, 680), dtype=np.uint8)
    before = raw.copy()
    out = to_host_order(raw, fmt, "big")
    assert isinstance(out, np.ndarray) and out.shape == raw.shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out, to_host_order(torch.from_numpy(raw.copy()), fmt, "big").numpy())
    np.testing.assert_array_equal(raw, before)
    assert (out is raw) == (fmt == "I8")
