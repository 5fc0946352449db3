"""One-byte KV caches in the SDK's reference kernels: storage, per-layer scales, attention."""

import pytest
import torch
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.kv_cache import (
    E4M3_CALIBRATION_TARGET,
    KVCacheLayout,
    calibrate,
    kv_torch_dtype,
    new_kv_scale,
    quantize,
)
from plugins.reference import ReferencePlatform, engine_config


def test_storage_is_torch_float8_with_saturation():
    x = torch.tensor([0.0, 0.3, -1.7, 1000.0, -1e6, 3e-3])
    e4m3 = quantize(x, torch.float8_e4m3fn)
    assert e4m3.tolist()[:3] == x[:3].to(torch.float8_e4m3fn).float().tolist()
    assert e4m3.float()[3:5].tolist() == [448.0, -448.0]  # a plain cast gives NaN
    assert quantize(x, torch.float8_e5m2).float()[4].item() == -57344.0  # a plain cast gives -inf
    assert quantize(x, torch.float8_e5m2).float()[5].item() == x[5:].to(torch.float8_e5m2).float().item()
    assert torch.equal(quantize(x, torch.float32), x)  # a 16/32-bit cache: a plain cast


def test_first_write_sets_each_scale_once():
    scale = new_kv_scale("cpu")
    calibrate(scale, torch.tensor([1.0, -8.0]), torch.tensor([0.5]))
    assert scale.tolist() == pytest.approx([8 / E4M3_CALIBRATION_TARGET, 0.5 / E4M3_CALIBRATION_TARGET])
    calibrate(scale, torch.tensor([100.0]), torch.tensor([100.0]))  # later writes keep it
    assert scale.tolist() == pytest.approx([8 / E4M3_CALIBRATION_TARGET, 0.5 / E4M3_CALIBRATION_TARGET])
    zeros = new_kv_scale("cpu")
    calibrate(zeros, torch.zeros(3), torch.zeros(3))
    assert zeros.tolist() == [1.0, 1.0]  # nothing to calibrate on: vLLM's default


def test_resolved_names():
    assert kv_torch_dtype("fp8_e4m3") == torch.float8_e4m3fn and kv_torch_dtype("bfloat16") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown resolved KV cache dtype 'fp8'"):
        kv_torch_dtype("fp8")


@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_reference_attention_over_fp8_cache_is_close_to_float32(cache_dtype):
    """Random K (larger) and V (small, where E4M3 without a scale would be subnormal): the
    fp8 round trip moves the attention output by a few percent (E4M3 keeps 3 mantissa bits), and the E4M3
    calibrated scale beats vLLM's default of 1.0."""
    gen = torch.Generator().manual_seed(0)
    meta = AttentionMetadata.build([6, 1, 1], [6, 20, 9], [[0, 1], [2, 3, 4, 5, 6], [7, 8, 9]], 4)
    q = torch.randn(meta.num_tokens, 4, 32, generator=gen)
    kernels, shape = Kernels(), (10, 4, 2, 32)
    full = AttentionMetadata.build([6, 20, 9], [6, 20, 9], [[0, 1], [2, 3, 4, 5, 6], [7, 8, 9]], 4)
    k_all = torch.randn(full.num_tokens, 2, 32, generator=gen) * 4
    v_all = torch.randn(full.num_tokens, 2, 32, generator=gen) * 0.01

    def error(scale):
        kc, vc = torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype)
        kw = {} if scale is None else {"kv_scale": scale}
        kernels.write_kv_cache(k_all, v_all, kc, vc, full.slot_mapping, **kw)
        got = kernels.paged_attention(q, kc, vc, meta, 32**-0.5, **kw)
        kf, vf = torch.zeros(shape), torch.zeros(shape)
        kernels.write_kv_cache(k_all, v_all, kf, vf, full.slot_mapping)
        want = kernels.paged_attention(q, kf, vf, meta, 32**-0.5)
        return ((got - want).norm() / want.norm()).item()

    if cache_dtype == torch.float8_e5m2:
        assert error(None) < 0.1
    else:
        calibrated, unit = error(new_kv_scale("cpu")), error(torch.ones(2))
        assert calibrated < 0.07 and calibrated < 0.8 * unit, (calibrated, unit)


def test_standard_layout_is_what_the_kernels_read():
    layout = KVCacheLayout.standard(16, 2, 8, torch.bfloat16)
    assert layout.shapes(5) == ((5, 16, 2, 8), (5, 16, 2, 8))
    assert layout.block_bytes == 2 * 16 * 2 * 8 * 2  # K and V, bfloat16
    config = engine_config(block_size=16, kv_cache_dtype="bfloat16")
    assert ReferencePlatform().kv_cache_layout(config, 2, 8) == layout


def test_a_layout_with_scale_rows_counts_them():
    """OpenVINO's u8 blocks: keys with 8 rows of per-channel scales, values with 8 bytes a token."""
    layout = KVCacheLayout((2, 16 + 8, 8), (2, 16, 8 + 8), torch.uint8)
    assert layout.shapes(3) == ((3, 2, 24, 8), (3, 2, 16, 16))
    assert layout.block_bytes == 2 * 24 * 8 + 2 * 16 * 16


def test_a_layout_with_a_bad_dimension_is_refused():
    with pytest.raises(ValueError, match="key_block must be positive ints, got \\(16, 0, 8\\)"):
        KVCacheLayout((16, 0, 8), (16, 2, 8), torch.float32)
