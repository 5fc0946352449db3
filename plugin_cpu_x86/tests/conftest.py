"""Fixtures: the native kernels once per ISA path this CPU can run, and the reference."""

from __future__ import annotations

import pytest
import torch
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.cpu_native.library import Q4_0, Q4_1, Q4FX8, X8
from plugins.kernels import Kernels

#: CPU_KERNEL_ISA values each kernel test runs under (skipped where the CPU lacks it)
ISA_PATHS = ("amx", "avx512", "avx512vnni", "avx2", "scalar")
#: (atol, rtol) of kernel outputs vs the float32 torch reference, per dtype; bf16
#: allows about one bf16 ulp (2^-8 relative) of rounding difference
TOLERANCES = {torch.float32: (2e-5, 2e-5), torch.bfloat16: (2e-2, 1.6e-2)}


@pytest.fixture(params=ISA_PATHS)
def kernels(request, monkeypatch):
    """The platform's kernels with CORE_CPU_KERNEL_ISA forced to one path."""
    monkeypatch.setenv("CORE_CPU_KERNEL_ISA", request.param)
    platform = CpuX86Platform()
    try:
        kern = platform.kernels
    except ValueError as exc:  # the CPU lacks this ISA
        pytest.skip(str(exc))
    assert request.param in kern.isa  # amx: avx512amx, avx512: the best AVX-512 build without AMX (bf16 or vnni)
    return kern


@pytest.fixture
def ref() -> Kernels:
    return Kernels()


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def rand(shape, dtype, gen, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    atol, rtol = TOLERANCES[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def act16_quant(x: torch.Tensor) -> torch.Tensor:
    """x with each block of 32 rounded to int16 levels of scale amax / 32512 (127 * 256)."""
    xb = x.float().reshape(x.shape[0], -1, 32)
    d = xb.abs().amax(-1, keepdim=True) / 32512
    return (torch.round(xb / torch.where(d > 0, d, 1)) * d).reshape(x.shape)


#: x8 codes of 4-bit weights, which the AVX2 build keeps on int16 up to 64 rows
Q4_X8_CODES = (Q4_0 + X8, Q4_1 + X8, Q4FX8)


def multiplied(kernels, prepared, x: torch.Tensor) -> torch.Tensor:
    """The activations the default path multiplies ``prepared`` with: int16-rounded on x8 weights
    (builds without AVX-512: below 7 rows, 64 on 4-bit weights, from there the float32 panel kernel,
    native/src/quant.cpp act16_on_panel; the AMX build: below kAmxMinRows = 24 rows,
    native/src/blocks.h, from there the tile kernels), else ``x``."""
    if getattr(prepared, "act16", False):
        if kernels.isa == "avx512amx":
            return act16_quant(x) if x.shape[0] < 24 else x
        if kernels.isa.startswith("avx512") or x.shape[0] < (64 if prepared.code in Q4_X8_CODES else 7):
            return act16_quant(x)
    return x


@pytest.fixture(name="multiplied")
def multiplied_fixture(kernels):
    """``multiplied(prepared, x)``: the activations the default path multiplies (:func:`multiplied`)
    on the ``kernels`` of this test (``multiplied.kernels``)."""

    def fn(prepared, x: torch.Tensor) -> torch.Tensor:
        return multiplied(kernels, prepared, x)

    fn.kernels = kernels
    return fn


@pytest.fixture(name="rand")
def rand_fixture():
    """``rand(shape, dtype, gen, scale=1.0)``: normal random tensor (helpers are fixtures
    because the repository runs pytest with --import-mode=importlib)."""
    return rand


@pytest.fixture(name="close")
def close_fixture():
    """``close(actual, expected, what)``: assert within :data:`TOLERANCES`."""
    return assert_close
