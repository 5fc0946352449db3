"""The native MoE kernel (native/src/moe.cpp) against the SDK's grouped default, on every ISA path.

Dense float32 and bfloat16 experts, GGUF expert stacks (Q8_0, Q4_0, Q4_1, Q4_K) kept quantized, each
with ``CPU_MOE_PREPACK`` on (repacked as the dense linears are) and off (as stored); one token, a
decode batch, a prefill of more (token, expert) pairs than one pass of the kernel takes; what the
kernel does not take stays with the default.
"""

from __future__ import annotations

import pytest
import torch
from plugin_cpu_x86.platform import CpuX86Platform
from plugins.cpu_native.moe import BF16W, NativeExperts
from plugins.moe import ExpertWeights
from plugins.reference import random_gguf_weight

NUM_EXPERTS = 8


def routing(gen, tokens, top_k):
    logits = torch.randn((tokens, NUM_EXPERTS), generator=gen)
    return torch.topk(torch.softmax(logits, dim=-1), top_k, dim=-1)


def dense_experts(rand, gen, dtype, hidden, inter):
    gate_up = rand((NUM_EXPERTS, 2 * inter, hidden), dtype, gen, hidden**-0.5)
    return ExpertWeights(gate_up, rand((NUM_EXPERTS, hidden, inter), dtype, gen, inter**-0.5), NUM_EXPERTS)


def gguf_experts(qtype, hidden, inter):
    """Random GGUF stacks of every expert's rows (scales sized for outputs of about unit size)."""
    gate_up = random_gguf_weight(qtype, NUM_EXPERTS * 2 * inter, hidden, seed=1, scale=0.01)
    return ExpertWeights(gate_up, random_gguf_weight(qtype, NUM_EXPERTS * hidden, inter, seed=2, scale=0.01),
                         NUM_EXPERTS)  # fmt: skip


def native_calls(kernels):
    """The native fused_moe calls made from now on (a fallback to the default would pass the checks too)."""
    calls, native = [], kernels.lib.fused_moe
    kernels.lib.fused_moe = lambda *args: calls.append(args[4]) or native(*args)
    return calls


@pytest.mark.parametrize("prepack", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
# on 2 threads, (1, 2) takes whole experts a thread (gate and up in one call where no padding parts
# them: float32 here, not bfloat16's 64-row tiles), the others blocks of rows
@pytest.mark.parametrize("tokens,top_k", [(1, 2), (1, 3), (5, 3), (40, 2)])
def test_dense_experts_match_the_default(kernels, ref, gen, rand, close, prepack, dtype, tokens, top_k):
    hidden, inter = 96, 160  # two work items of intermediate rows, the second partial
    experts = dense_experts(rand, gen, dtype, hidden, inter)
    x = rand((tokens, hidden), dtype, gen)
    weights, ids = routing(gen, tokens, top_k)
    kernels.moe_prepack = prepack
    prepared = kernels.prepare_experts(experts, None)
    if dtype == torch.bfloat16 and not (prepack and kernels.lib.linear_bf16w_ready()):
        assert prepared is experts, "bfloat16 experts as stored have no native kernel: the default runs them"
        return
    assert isinstance(prepared, NativeExperts)
    assert (prepared.gate_up.code == BF16W) == (dtype == torch.bfloat16)
    calls = native_calls(kernels)
    got = kernels.fused_moe(x, prepared, weights, ids)
    assert calls == [tokens]
    close(got, ref.fused_moe(x, experts, weights, ids), f"fused_moe, {tokens} tokens, top {top_k}")


@pytest.mark.parametrize("prepack", [True, False])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K"])
@pytest.mark.parametrize("tokens", [1, 12])
def test_gguf_experts_stay_quantized(kernels, ref, gen, rand, prepack, qtype, tokens):
    """Expert blocks as llama.cpp stores them: repacked in groups of 8 rows (the int16-activation
    kernel's rounding, ~2^-16 of a block's largest input) or multiplied as stored."""
    hidden = inter = 256  # whole K-quant super-blocks
    experts = gguf_experts(qtype, hidden, inter)
    kernels.moe_prepack = prepack
    prepared = kernels.prepare_experts(experts, "gguf")
    assert isinstance(prepared, NativeExperts)
    for projection in (prepared.gate_up, prepared.down):
        assert projection.data.dtype in (torch.uint8, torch.int8), "the experts must stay quantized"
        assert (projection.group == 8) == (prepack and kernels.lib.x8_simd)
    x = rand((tokens, hidden), torch.float32, gen)
    weights, ids = routing(gen, tokens, 2)
    calls = native_calls(kernels)
    got = kernels.fused_moe(x, prepared, weights, ids)
    assert calls == [tokens]
    want = ref.fused_moe(x, experts, weights, ids)
    torch.testing.assert_close(got, want, atol=2e-3 * want.abs().max().item(), rtol=1e-3)


def test_a_long_prefill_takes_several_passes(kernels, ref, gen, rand, close):
    """4500 (token, expert) pairs: more than one pass of the kernel (4096); every token's row is its own."""
    experts = dense_experts(rand, gen, torch.float32, 32, 32)
    x = rand((2250, 32), torch.float32, gen)
    weights, ids = routing(gen, 2250, 2)
    got = kernels.fused_moe(x, kernels.prepare_experts(experts, None), weights, ids)
    close(got, ref.fused_moe(x, experts, weights, ids), "fused_moe over 2250 tokens")


def test_what_the_kernel_does_not_take_runs_the_default(kernels, ref, gen, rand):
    """An intermediate size that is no multiple of 32 keeps the experts as loaded (the default runs them);
    an expert id out of range is refused by name."""
    experts = dense_experts(rand, gen, torch.float32, 64, 48)
    assert kernels.prepare_experts(experts, None) is experts
    packed = kernels.prepare_experts(dense_experts(rand, gen, torch.float32, 64, 64), None)
    x = rand((2, 64), torch.float32, gen)
    with pytest.raises(IndexError, match="expert id outside 0..7"):
        kernels.fused_moe(x, packed, torch.ones(2, 1), torch.tensor([[3], [8]]))
    with pytest.raises(ValueError, match=r"x \[tokens, 64\]"):
        kernels.fused_moe(x[:, :32], packed, torch.ones(2, 1), torch.tensor([[3], [1]]))


@pytest.mark.parametrize("variable", ["CORE_CPU_MOE_PREPACK", "VLLM_CPU_MOE_PREPACK"])
def test_prepack_is_read_from_the_environment(monkeypatch, variable):
    for name in ("CORE_CPU_MOE_PREPACK", "VLLM_CPU_MOE_PREPACK"):
        monkeypatch.delenv(name, raising=False)
    assert CpuX86Platform().kernels.moe_prepack
    monkeypatch.setenv(variable, "0")
    assert not CpuX86Platform().kernels.moe_prepack
