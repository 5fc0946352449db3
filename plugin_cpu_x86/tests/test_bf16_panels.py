"""bfloat16 products of many rows on GGUF/int8 weights packed once as bfloat16 (CPU_BF16_PREPACK).

From ``bf16_panel_min_rows`` activation rows (the library's choice: native/src/encoder.cpp) a bfloat16 product takes the weight rounded to
bfloat16 and packed (``linear_bf16w``), made on first use and kept with the weight; fewer rows,
and kernels that do not prepack, dequantize the weight in the product as before.
"""

from __future__ import annotations

import gguf
import pytest
import torch
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.cpu_native.bf16 import pack_bf16, reference_bf16_linear
from plugins.cpu_native.library import DTYPE_BF16, DTYPE_F32
from plugins.kernels import GGUFWeight


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Within a bfloat16 rounding of the output (the sums' order differs)."""
    torch.testing.assert_close(actual.float(), expected.float(), atol=2e-2, rtol=1.6e-2, msg=lambda m: f"{what}: {m}")


def prepack_kernels(monkeypatch, prepack: bool):
    monkeypatch.setenv("CORE_CPU_KERNEL_ISA", "avx512")
    monkeypatch.setenv("CORE_CPU_BF16_PREPACK", "1" if prepack else "0")
    try:
        kernels = CpuX86Platform().kernels
    except ValueError as exc:
        pytest.skip(str(exc))
    if not kernels.lib.bf16_panel_min_rows():
        pytest.skip(f"the {kernels.isa} kernels keep the weights' own formats (no AVX512_BF16, or AMX)")
    return kernels


def q4_1(n: int, k: int, gen: torch.Generator) -> GGUFWeight:
    w = (torch.randn(n, k, generator=gen) * 0.05).numpy()
    return GGUFWeight("Q4_1", torch.from_numpy(gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)), n, k)


@pytest.mark.parametrize("rows", [0, 33, 130])
def test_many_rows_take_the_packed_panels(monkeypatch, gen, rows):
    kernels = prepack_kernels(monkeypatch, True)
    rows = rows or kernels.bf16_panel_min_rows
    weight = kernels.prepare_linear(q4_1(200, 96, gen), "gguf")
    x = torch.randn(rows, 96, generator=gen).bfloat16()
    bias = torch.randn(200, generator=gen)
    out = kernels.linear(x, weight, bias)
    assert len(weight.panels) == 1, "the panels are made on the first product of many rows, once"
    expected = reference_bf16_linear(x, weight.panels[0], bias)
    assert torch.equal(weight.panels[0].unpacked(), weight.dequantize().bfloat16())
    assert_close(out, expected, f"{rows} rows on the packed panels")
    kernels.linear(x, weight, bias)
    assert len(weight.panels) == 1


def test_few_rows_and_prepack_off_dequantize_per_product(monkeypatch, gen):
    kernels = prepack_kernels(monkeypatch, True)
    weight = kernels.prepare_linear(q4_1(64, 96, gen), "gguf")
    kernels.linear(torch.randn(kernels.bf16_panel_min_rows - 1, 96, generator=gen).bfloat16(), weight)
    kernels.linear(torch.randn(kernels.bf16_panel_min_rows, 96, generator=gen), weight)  # float32: no panels
    assert not weight.panels

    off = prepack_kernels(monkeypatch, False)
    assert off.bf16_panel_min_rows == 0
    weight = off.prepare_linear(q4_1(64, 96, gen), "gguf")
    x = torch.randn(40, 96, generator=gen).bfloat16()
    out = off.linear(x, weight)
    assert not weight.panels and off.bf16_panels(weight) is None
    assert_close(out, (x.float() @ weight.dequantize().T).bfloat16(), "CPU_BF16_PREPACK=0")


@pytest.mark.parametrize("rows,bias", [(9, False), (130, True)])
def test_gate_up_silu_in_one_pass_equals_two(monkeypatch, gen, rows, bias):
    """linear_bf16w_silu_mul (the fused decoder's gate_up) gives linear_bf16w then silu_and_mul's
    bits; 130 rows of k = 576 span two of its row blocks. An inter that is not a multiple of the
    packed groups' 64 rows is refused with -3 (the caller's two passes)."""
    kernels = prepack_kernels(monkeypatch, True)
    lib, inter, k = kernels.lib, 128, 576
    weight = pack_bf16(torch.randn(2 * inter, k, generator=gen) * 0.05)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    b = torch.randn(2 * inter, generator=gen) if bias else None
    bias_arg = (b.data_ptr() if bias else None, DTYPE_F32)
    gate_up = x.new_empty(rows, 2 * inter)
    two, one = x.new_empty(rows, inter), x.new_full((rows, inter), float("nan"))
    assert not lib.linear_bf16w(weight.data_ptr, 2 * inter, k, DTYPE_BF16, x.data_ptr(), k, rows, gate_up.data_ptr(),
                                *bias_arg, 0, 2)  # fmt: skip
    lib.silu_and_mul(DTYPE_BF16, two.data_ptr(), gate_up.data_ptr(), 2 * inter, rows, inter, 2)
    assert not lib.linear_bf16w_silu_mul(weight.data_ptr, inter, k, x.data_ptr(), k, rows, one.data_ptr(), *bias_arg, 2)
    assert torch.equal(one, two), f"differ by {(one.float() - two.float()).abs().max()}"
    odd = pack_bf16(torch.randn(2 * 96, k, generator=gen))
    assert lib.linear_bf16w_silu_mul(odd.data_ptr, 96, k, x.data_ptr(), k, rows, one.data_ptr(), None, 0, 2) == -3
