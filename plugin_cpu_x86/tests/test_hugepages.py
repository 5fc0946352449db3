"""The huge-page arena of the repacked quantized weights (plugins/hugepages.py)."""

import gc

import gguf
import numpy as np
import pytest
import torch
from plugin_cpu_x86.platform import ISA_TABLE
from plugins.cpu_native.kernels import NativeCpuKernels
from plugins.hugepages import ALIGN, CHUNK, HugePageArena, huge_pages_supported
from plugins.kernels import GGUFWeight

pytestmark = pytest.mark.skipif(not huge_pages_supported(), reason="no MADV_HUGEPAGE on this platform")


def vm_flags(ptr: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds address ``ptr`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {ptr:#x}")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.float32])
@pytest.mark.parametrize("shape", [(1,), (3, 7), (2 << 10, 300)])
def test_copy_is_equal_aligned_and_marked(dtype, shape):
    gen = torch.Generator().manual_seed(0)
    t = torch.randint(-100, 100, shape, generator=gen).to(dtype)
    out = HugePageArena().copy(t)
    assert out.dtype == t.dtype and out.shape == t.shape and out.is_contiguous()
    assert torch.equal(out, t)
    assert out.data_ptr() != t.data_ptr() and out.data_ptr() % ALIGN == 0
    assert "hg" in vm_flags(out.data_ptr())  # MADV_HUGEPAGE


def test_small_copies_share_a_mapping_large_ones_get_their_own():
    arena = HugePageArena()
    a, b = arena.copy(torch.ones(100, dtype=torch.uint8)), arena.copy(torch.ones(100, dtype=torch.uint8))
    assert b.data_ptr() - a.data_ptr() == 128  # the next cache line of the same mapping
    big = arena.copy(torch.ones(CHUNK + 1, dtype=torch.uint8))
    c = arena.copy(torch.ones(100, dtype=torch.uint8))
    assert c.data_ptr() - a.data_ptr() == 256  # the big copy did not take the shared mapping's space
    assert big.data_ptr() % (2 << 20) == 0 and big[-1].item() == 1 and "hg" in vm_flags(big.data_ptr())


def test_a_full_mapping_opens_another():
    arena = HugePageArena()
    first = arena.copy(torch.ones(CHUNK - ALIGN, dtype=torch.uint8))
    second = arena.copy(torch.full((2 * ALIGN,), 7, dtype=torch.uint8))
    assert not first.data_ptr() <= second.data_ptr() < first.data_ptr() + CHUNK
    assert torch.equal(second, torch.full((2 * ALIGN,), 7, dtype=torch.uint8))


def test_copies_outlive_the_arena():
    arena = HugePageArena()
    out = arena.copy(torch.arange(1000, dtype=torch.float32))
    del arena
    gc.collect()
    assert torch.equal(out, torch.arange(1000, dtype=torch.float32))


def test_empty_tensor_is_returned_as_is():
    t = torch.empty(0, 32, dtype=torch.uint8)
    assert HugePageArena().copy(t) is t


@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_prepared_x8_weights_live_in_huge_pages(isa):
    """The default path's (int16) and int8 activations' repacked weights: in the arena, same products."""
    if isa not in ISA_TABLE.choices:
        pytest.skip(f"no {isa} choice")
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(40, 64, generator=gen)
    data = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0)
    weight = GGUFWeight("Q4_0", torch.from_numpy(np.ascontiguousarray(data)), 40, 64)
    x = torch.randn(3, 64, generator=gen)
    for quantize_activations in (False, True):
        kernels = NativeCpuKernels(ISA_TABLE, isa, num_threads=2, quantize_activations=quantize_activations)
        prepared = kernels.prepare_linear(weight, "gguf")
        if not prepared.interleaved:
            pytest.skip(f"{kernels.isa}: weights kept as stored")
        assert "hg" in vm_flags(prepared.data_ptr)
        plain = prepared.__class__(
            prepared.fmt, prepared.code, prepared.data.clone(), None, 40, 64, act16=prepared.act16
        )  # the same weight in ordinary memory
        assert torch.equal(kernels.linear(x, prepared), kernels.linear(x, plain))


@pytest.mark.parametrize("quantization,fmt", [("gguf", "Q4_0"), (None, "float32")])
def test_packed_experts_live_in_huge_pages(quantization, fmt):
    """MoE experts packed for fused_moe (one tensor a projection, stacked after each expert's
    preparation): in the arena too, not in the ordinary pages the stacking made."""
    from plugins.moe import ExpertWeights
    from plugins.reference import random_gguf_weight

    experts, hidden, inter = 4, 64, 96
    if fmt == "float32":
        gen = torch.Generator().manual_seed(2)
        stacks = (
            torch.randn(experts, 2 * inter, hidden, generator=gen),
            torch.randn(experts, hidden, inter, generator=gen),
        )
    else:
        stacks = (random_gguf_weight(fmt, experts * 2 * inter, hidden, seed=1, scale=0.01),
                  random_gguf_weight(fmt, experts * hidden, inter, seed=2, scale=0.01))  # fmt: skip
    kernels = NativeCpuKernels(ISA_TABLE, "auto", num_threads=2)
    kernels.moe_prepack = True
    packed = kernels.prepare_experts(ExpertWeights(*stacks, experts), quantization)
    for projection in (packed.gate_up, packed.down):
        assert "hg" in vm_flags(projection.data.data_ptr())


def test_float32_weights_live_in_huge_pages():
    """Full-precision float32 matrices (F16/F32 GGUF files, float32 checkpoints) are copied into the
    arena with their values; small ones and other dtypes stay as they came."""
    from plugins.cpu_native.linear import DENSE_ARENA_MIN

    kernels = NativeCpuKernels(ISA_TABLE, "auto", num_threads=2)
    gen = torch.Generator().manual_seed(3)
    big = torch.randn(DENSE_ARENA_MIN // 64, 64, generator=gen)
    prepared = kernels.prepare_linear(big, None)
    assert prepared is not big and torch.equal(prepared, big)
    assert "hg" in vm_flags(prepared.data_ptr())
    x = torch.randn(2, 64, generator=gen)
    assert torch.equal(kernels.linear(x, prepared), kernels.linear(x, big))
    small, bf16 = torch.randn(8, 64, generator=gen), big.bfloat16()
    assert kernels.prepare_linear(small, None) is small
    assert kernels.prepare_linear(bf16, None) is bf16


def test_kv_cache_lives_in_huge_pages():
    """The CPU platforms' KV cache (CpuMemoryProfiler.allocate_kv_cache): the shape and dtype asked
    for, in a mapping marked for huge pages, writable everywhere."""
    from plugin_cpu_x86.platform import CpuX86Platform
    from plugins.cpu import CpuMemoryProfiler

    shape = (2, 3, 16, 5, 64)
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        cache = CpuMemoryProfiler(CpuX86Platform()).allocate_kv_cache(shape, dtype, torch.device("cpu"))
        assert cache.shape == shape and cache.dtype == dtype and cache.is_contiguous()
        assert "hg" in vm_flags(cache.data_ptr())
        cache.view(torch.uint8).fill_(7)
        assert bool((cache.view(torch.uint8) == 7).all())
