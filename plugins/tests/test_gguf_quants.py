"""The torch dequantization of GGUF blocks against the ``gguf`` package's, bit for bit."""

import gguf
import numpy as np
import pytest
import torch
from plugins.errors import UnsupportedFeature
from plugins.gguf_quants import FORMATS, dequantize, row_bytes
from plugins.reference import random_gguf_weight


def gguf_reference(qtype: str, data: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]))


@pytest.mark.parametrize("qtype", sorted(FORMATS))
@pytest.mark.parametrize("shape", [(3, 512), (17, 256 * 5)])
def test_random_blocks_match_gguf_bit_for_bit(qtype, shape):
    rows, cols = shape
    data = random_gguf_weight(qtype, rows, cols, seed=rows).data.numpy()
    ours = dequantize(qtype, torch.from_numpy(data), rows, cols)
    assert ours.dtype == torch.float32 and ours.shape == (rows, cols)
    torch.testing.assert_close(ours, gguf_reference(qtype, data), atol=0, rtol=0)


def test_bad_input_is_named():
    with pytest.raises(UnsupportedFeature, match="IQ2_XS"):
        row_bytes("IQ2_XS", 256)
    with pytest.raises(ValueError, match="whole blocks of 256"):
        row_bytes("Q4_K", 640)
    with pytest.raises(ValueError, match="needs 288 uint8 bytes, got 144"):
        dequantize("Q4_K", torch.zeros(144, dtype=torch.uint8), 2, 256)
