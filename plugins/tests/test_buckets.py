"""The one ramp-up ladder every bucketing backend configures (plugins.buckets)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from plugins.buckets import pad_size, ramp_up_range, rungs, smallest_at_least


def test_gaudi_guide_examples():
    assert ramp_up_range(2, 32, 64) == [2, 4, 8, 16, 32, 64]
    assert ramp_up_range(128, 128, 512) == [128, 256, 384, 512]


def test_each_backends_configuration():
    assert ramp_up_range(1, 8, 20, end="max") == [1, 2, 4, 8, 16, 20]  # CUDA graph batch sizes
    assert ramp_up_range(128, None, 3000, end="max") == [128, 256, 512, 1024, 2048, 3000]  # Neuron lengths
    assert ramp_up_range(128, None, 100, end="max") == [100]
    assert ramp_up_range(16, None, 1000, end="cover") == [16, 32, 64, 128, 256, 512, 1024]  # TPU tokens
    assert ramp_up_range(16, 64, 200, end="cover") == [16, 32, 64, 128, 192, 256]
    assert ramp_up_range(16, None, 10, end="cover") == [16]


def test_min_above_step_starts_at_the_first_multiple():
    assert ramp_up_range(3, 16, 40) == [3, 6, 12, 16, 32]
    assert ramp_up_range(128, 32, 256) == [128, 160, 192, 224, 256]
    assert ramp_up_range(130, 32, 200) == [160, 192]  # none below min


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="min and step must be positive integers, got min=0 step=8"):
        ramp_up_range(0, 8, 64)
    with pytest.raises(ValueError, match="bucket max must be a positive integer, got 0"):
        ramp_up_range(1, 8, 0)
    with pytest.raises(ValueError, match="unknown end 'up'; choose one of within, max, cover"):
        ramp_up_range(1, 8, 64, end="up")


def test_rungs_are_endless_and_double_without_step():
    ladder = rungs(5, None)
    assert [next(ladder) for _ in range(5)] == [5, 10, 20, 40, 80]


def test_lookup():
    sizes = [16, 32, 64]
    assert [smallest_at_least(v, sizes) for v in (1, 16, 17, 64, 65)] == [16, 16, 32, 64, None]
    assert pad_size(33, sizes) == 64
    with pytest.raises(ValueError, match="65 exceeds the largest padded size 64"):
        pad_size(65, sizes, "padded size")


@given(
    st.integers(1, 300),
    st.one_of(st.none(), st.integers(1, 300)),
    st.integers(1, 3000),
    st.sampled_from(["within", "max", "cover"]),
)
def test_ladder_properties(minimum, step, maximum, end):
    sizes = ramp_up_range(minimum, step, maximum, end)
    assert sizes == sorted(set(sizes))
    assert all(s >= minimum for s in sizes) or sizes == [maximum]
    if end == "within":
        assert all(s <= maximum for s in sizes)
    else:  # every size up to max has a bucket
        assert sizes and sizes[-1] >= maximum and sum(s > maximum for s in sizes) <= 1
    if end == "max":
        assert sizes[-1] == maximum
    ladder = sizes[:-1] if end == "max" else sizes  # "max" appends max itself
    if step is not None:  # past the ramp-up, buckets are the multiples of step
        assert all(s % step == 0 for s in ladder if s >= step)
