"""Padded sizes for XLA's static shapes."""

import pytest
from plugin_tpu.padding import padded_size, seq_paddings, token_paddings


def test_token_paddings_powers_of_two_from_16():
    assert token_paddings(2048) == [16, 32, 64, 128, 256, 512, 1024, 2048]
    assert token_paddings(1000) == [16, 32, 64, 128, 256, 512, 1024]  # the last covers max
    assert token_paddings(10) == [16]


def test_token_paddings_with_gap():
    assert token_paddings(200, padding_gap=64) == [16, 32, 64, 128, 192, 256]
    assert token_paddings(100, padding_gap=16) == [16, 32, 48, 64, 80, 96, 112]


def test_seq_paddings_end_at_max_num_seqs():
    assert seq_paddings(256) == [8, 16, 32, 64, 128, 256]
    assert seq_paddings(48) == [8, 16, 32, 48]
    assert seq_paddings(3) == [3]


def test_padded_size():
    sizes = token_paddings(512)
    assert padded_size(1, sizes) == 16
    assert padded_size(17, sizes) == 32
    assert padded_size(512, sizes) == 512
    with pytest.raises(ValueError, match="513 exceeds the largest padded size 512"):
        padded_size(513, sizes)


def test_bad_arguments():
    with pytest.raises(ValueError):
        token_paddings(0)
    with pytest.raises(ValueError):
        token_paddings(64, padding_gap=-1)
    with pytest.raises(ValueError):
        seq_paddings(0)
