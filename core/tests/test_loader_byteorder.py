"""The GGUF loader in a big-endian platform's byte order (``Platform.byte_order``).

A little-endian GGUF byte image (written by ``gguf.GGUFWriter``) goes through the loader's
``gguf_weights`` with ``byte_order="big"``; the tensors that come out are read back as
big-endian numbers and must hold the file's values: Q8_0 and Q4_1 blocks kept quantized
(their f16 scales swapped, the quantized values untouched) and a float32 tensor, also
when a tensor-parallel rank reads only its byte window of each tensor.
"""

from __future__ import annotations

from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from core.loader.gguf_index import GGUFIndex
from core.loader.gguf_model import gguf_weights
from core.partition.sharding import ShardPlan
from plugins.kernels import GGUFWeight

ROWS, COLS = 6, 64
QTYPES = {"output.weight": gguf.GGMLQuantizationType.Q8_0, "blk.0.ffn_down.weight": gguf.GGMLQuantizationType.Q4_1}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A little-endian GGUF image with two quantized linears and a float32 norm weight."""
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("byteorder") / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    values = {name: rng.standard_normal((ROWS, COLS)).astype(np.float32) for name in QTYPES}
    for name, qtype in QTYPES.items():
        writer.add_tensor(name, gguf.quants.quantize(values[name], qtype), raw_dtype=qtype)
    norm = rng.standard_normal(COLS).astype(np.float32)
    writer.add_tensor("output_norm.weight", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert np.little_endian  # the test reads the converted bytes as big-endian on this host
    return path, norm


CONFIG = SimpleNamespace(
    num_attention_heads=2, num_key_value_heads=2, intermediate_size=COLS, vocab_size=ROWS, tie_word_embeddings=False
)


def _load(
    path, byte_order: str, plan: ShardPlan | None = None, keep_gguf: bool = True
) -> dict[str, torch.Tensor | GGUFWeight]:
    index = GGUFIndex(path, {"general.architecture": "llama"}, GGUFIndex._parse(path).tensors)
    return dict(gguf_weights(index, CONFIG, keep_gguf, torch.float32, torch.device("cpu"), plan, byte_order))


def _dequantize_big_endian(weight: GGUFWeight) -> np.ndarray:
    """Q8_0 / Q4_1 blocks whose f16 fields are big-endian, to float32 (numpy's ``>f2``)."""
    raw = weight.data.numpy()
    if weight.qtype == "Q8_0":
        blocks = raw.reshape(-1, 34)
        scale = blocks[:, :2].copy().view(">f2").astype(np.float32)
        return (scale * blocks[:, 2:].view(np.int8)).reshape(weight.rows, weight.cols)
    blocks = raw.reshape(-1, 20)
    scale, low = (blocks[:, i : i + 2].copy().view(">f2").astype(np.float32) for i in (0, 2))
    nibbles = np.concatenate([blocks[:, 4:] & 15, blocks[:, 4:] >> 4], axis=1)
    return (scale * nibbles + low).reshape(weight.rows, weight.cols)


def test_quantized_blocks_hold_the_file_values_big_endian(gguf_file):
    path, _ = gguf_file
    little, big = _load(path, "little"), _load(path, "big")
    for name, qtype in QTYPES.items():
        hf_name = "lm_head.weight" if name == "output.weight" else "model.layers.0.mlp.down_proj.weight"
        ours, reference = big[hf_name], little[hf_name]
        assert isinstance(ours, GGUFWeight) and ours.qtype == qtype.name
        expected = gguf.quants.dequantize(reference.data.numpy(), qtype)
        np.testing.assert_array_equal(_dequantize_big_endian(ours), expected)
        size = 34 if qtype.name == "Q8_0" else 20
        quants = slice(2 if qtype.name == "Q8_0" else 4, size)  # single bytes: untouched
        np.testing.assert_array_equal(
            ours.data.numpy().reshape(-1, size)[:, quants], reference.data.numpy().reshape(-1, size)[:, quants]
        )
        assert not np.array_equal(ours.data.numpy(), reference.data.numpy())


def test_float_tensor_reads_back_big_endian(gguf_file):
    path, norm = gguf_file
    np.testing.assert_array_equal(_load(path, "little")["model.norm.weight"].numpy(), norm)
    np.testing.assert_array_equal(_load(path, "big")["model.norm.weight"].numpy().view(">f4"), norm)


def test_each_ranks_window_is_converted(gguf_file):
    """TP=2: lm_head's vocabulary rows and down_proj's input columns (one Q4_1 block of
    each row) read big-endian hold the same values as that part of the whole tensor."""
    path, norm = gguf_file
    whole = _load(path, "big")
    for rank in range(2):
        plan = ShardPlan(CONFIG, 16, rank, 2)
        for name, part in _load(path, "big", plan).items():
            cut = plan.slice_for(name)
            if isinstance(part, GGUFWeight):
                expected = _dequantize_big_endian(whole[name])
                expected = expected[cut.start : cut.stop] if cut.dim == 0 else expected[:, cut.start : cut.stop]
                np.testing.assert_array_equal(_dequantize_big_endian(part), expected, err_msg=f"rank {rank} {name}")
            else:
                assert cut is None
                np.testing.assert_array_equal(part.numpy().view(">f4"), norm)


def test_each_ranks_window_dequantizes_to_its_part(gguf_file):
    """Dequantized (kernels that take no GGUF weights), a rank's window of rows, or of whole
    blocks of columns, holds that part of the whole tensor's values."""
    whole = _load(gguf_file[0], "little", keep_gguf=False)
    for rank in range(2):
        plan = ShardPlan(CONFIG, 16, rank, 2)
        for name, part in _load(gguf_file[0], "little", plan, keep_gguf=False).items():
            cut = plan.slice_for(name)
            expected = (
                whole[name]
                if cut is None
                else whole[name][cut.start : cut.stop]
                if cut.dim == 0
                else whole[name][:, cut.start : cut.stop]
            )
            assert torch.equal(part, expected), f"rank {rank} {name}"


def test_unknown_byte_order_is_named(gguf_file):
    with pytest.raises(ValueError, match="'middle'"):
        _load(gguf_file[0], "middle")
