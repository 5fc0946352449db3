"""MPS's documented memory and dtype rules, with the Mac's facts given as numbers.

Sources: PyTorch's "MPS Environment Variables" page (PYTORCH_MPS_HIGH_WATERMARK_RATIO
"by default 1.7"; PYTORCH_MPS_LOW_WATERMARK_RATIO "1.4 if the memory is unified and 1.0
if discrete"; high 0.0 "disables high watermark limit", 1.0 = recommendedMaxWorkingSetSize,
"0.95 means we allocate up to 95%"; low "between 0 to the high ratio", 0.0 disables it),
``torch.mps.set_per_process_memory_fraction`` ("Range: 0~2") and MPS's dtype errors
("doesn't support float64", "MPS BFloat16 is only supported on MacOS 14 or newer").
"""

import pytest
from plugin_apple.mps_rules import (
    Watermarks,
    dtype_unsupported_reason,
    resolve_watermarks,
    supported_dtypes,
    unified_kv_budget,
)
from plugin_apple.platform import ApplePlatform, MpsMemoryProfiler
from plugins.memory import GiB
from plugins.reference import engine_config

HIGH, LOW = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"


def test_documented_defaults():
    assert resolve_watermarks({}) == Watermarks(high=1.7, low=1.4)
    assert resolve_watermarks({}, unified_memory=False) == Watermarks(high=1.7, low=1.0)


def test_ranges_and_the_low_at_most_high_rule():
    assert resolve_watermarks({HIGH: "2.0", LOW: "2.0"}) == Watermarks(2.0, 2.0)
    assert resolve_watermarks({HIGH: "0", LOW: "1.9"}) == Watermarks(0.0, 1.9)  # unlimited high: low up to 2
    assert resolve_watermarks({HIGH: "0.95", LOW: "0.95"}) == Watermarks(0.95, 0.95)
    with pytest.raises(ValueError, match=r"PYTORCH_MPS_HIGH_WATERMARK_RATIO='2.5': expected a number between 0"):
        resolve_watermarks({HIGH: "2.5"})
    with pytest.raises(ValueError, match=r"PYTORCH_MPS_LOW_WATERMARK_RATIO='-1'"):
        resolve_watermarks({LOW: "-1"})
    with pytest.raises(
        ValueError, match=r"LOW_WATERMARK_RATIO=0.9 must not exceed PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.8"
    ):
        resolve_watermarks({HIGH: "0.8", LOW: "0.9"})
    # a high ratio alone below the default low one is what PyTorch refuses as "invalid low watermark ratio 1.4"
    with pytest.raises(ValueError, match=r"LOW_WATERMARK_RATIO=1.4 \(its default\) must not exceed .*=0.8: set"):
        resolve_watermarks({HIGH: "0.8"})


def test_cap_under_the_watermarks():
    recommended = 48 * GiB
    assert Watermarks(1.7, 1.4).cap(recommended) == (48 * GiB, "recommended working set")
    assert Watermarks(0.95, 0.9).cap(recommended) == (
        int(0.9 * (48 * GiB)),
        "low watermark 0.9 x recommended working set",
    )
    assert Watermarks(0.8, 0.0).cap(recommended) == (
        int(0.8 * (48 * GiB)),
        "high watermark 0.8 x recommended working set",
    )
    assert Watermarks(0.0, 0.0).cap(recommended)[0] == 48 * GiB  # both unlimited: Metal's recommendation stays
    assert Watermarks(0.0, 0.0).limit(0.0, recommended) is None


def test_kv_budget_under_the_watermark():
    # 48 GiB recommended, 1 GiB of weights allocated, 0.5 GiB profile peak, utilization 0.9
    budget, why = unified_kv_budget(48 * GiB, GiB, GiB // 2, 0.9, Watermarks(1.7, 1.4))
    assert budget == int(48 * GiB * 0.9) - GiB - GiB // 2
    assert why == "90% of 48.0 GiB (recommended working set) minus 1.50 GiB in use"
    lowered, _ = unified_kv_budget(48 * GiB, GiB, GiB // 2, 0.9, Watermarks(0.5, 0.5))
    assert lowered == int(24 * GiB * 0.9) - GiB - GiB // 2
    assert unified_kv_budget(8 * GiB, 8 * GiB, 0, 0.9, Watermarks(1.7, 1.4))[0] == 0  # never negative


def test_dtype_rules():
    assert dtype_unsupported_reason("float64", (15, 0)).startswith("MPS has no float64")
    assert (
        dtype_unsupported_reason("bfloat16", (13, 6)) == "bfloat16 on MPS needs macOS 14.0 or later, this is macOS 13.6"
    )
    assert dtype_unsupported_reason("bfloat16", (14, 0)) is None
    assert dtype_unsupported_reason("float8_e4m3fn", (15, 0)).startswith("MPS does not run dtype 'float8_e4m3fn'")
    assert supported_dtypes((13, 6)) == ("float16", "float32")
    assert supported_dtypes((14, 0)) == ("float16", "float32", "bfloat16")
    assert supported_dtypes((12, 0)) == ()


class Mac:
    """torch.mps's memory calls as a Mac answers them (recommended working set, driver allocation)."""

    def __init__(self, recommended: int, allocated: int) -> None:
        self.recommended, self.allocated = recommended, allocated

    def recommended_max_memory(self) -> int:
        return self.recommended

    def driver_allocated_memory(self) -> int:
        return self.allocated

    def synchronize(self) -> None:
        pass


def profiler(monkeypatch, mac, **env):
    for name in (
        HIGH,
        LOW,
        "CORE_APPLE_MPS_HIGH_WATERMARK_RATIO",
        "CORE_APPLE_MPS_LOW_WATERMARK_RATIO",
        "CORE_APPLE_KVCACHE_SPACE",
    ):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return MpsMemoryProfiler(ApplePlatform(), device=mac)


def test_profiler_budgets_kv_under_the_watermarks(monkeypatch):
    mac = Mac(recommended=16 * GiB, allocated=2 * GiB)
    config = engine_config(gpu_memory_utilization=0.9)
    plan = profiler(monkeypatch, mac).plan_kv_cache(config, block_bytes=GiB // 4, peak_activation_bytes=GiB)
    assert plan.budget_bytes == int(16 * GiB * 0.9) - 3 * GiB and plan.num_blocks == int((14.4 - 3) * 4)
    # CORE_APPLE_MPS_*_WATERMARK_RATIO become PyTorch's variables: the budget follows them
    lowered = profiler(
        monkeypatch, mac, CORE_APPLE_MPS_HIGH_WATERMARK_RATIO="0.5", CORE_APPLE_MPS_LOW_WATERMARK_RATIO="0.5"
    )
    assert lowered.plan_kv_cache(config, GiB).budget_bytes == int(8 * GiB * 0.9) - 2 * GiB
    # PyTorch's own variable, already set, is what MPS reads: it wins
    torch_set = profiler(
        monkeypatch, mac, CORE_APPLE_MPS_HIGH_WATERMARK_RATIO="0.5", PYTORCH_MPS_HIGH_WATERMARK_RATIO="0"
    )
    assert torch_set.platform.watermarks() == Watermarks(0.0, 1.4)
    assert profiler(monkeypatch, mac).free_memory() == 14 * GiB


def test_fixed_kv_space_must_fit_under_the_high_watermark(monkeypatch):
    mac = Mac(recommended=16 * GiB, allocated=2 * GiB)
    fits = profiler(monkeypatch, mac, CORE_APPLE_KVCACHE_SPACE="4")
    assert fits.kv_cache_budget(engine_config(), GiB) == (4 * GiB, "APPLE_KVCACHE_SPACE=4.0 GiB")
    too_big = profiler(monkeypatch, mac, CORE_APPLE_KVCACHE_SPACE="6", CORE_APPLE_MPS_HIGH_WATERMARK_RATIO="0.5",
                       CORE_APPLE_MPS_LOW_WATERMARK_RATIO="0.5")  # fmt: skip
    with pytest.raises(ValueError, match=r"APPLE_KVCACHE_SPACE=6.0 GiB does not fit: .* 0.5 x 16.0 GiB = 8.00 GiB"):
        too_big.kv_cache_budget(engine_config(), GiB)


def test_check_config_refuses_watermarks_before_mps_does(monkeypatch):
    monkeypatch.delenv(LOW, raising=False)
    monkeypatch.setenv(HIGH, "0.6")
    with pytest.raises(ValueError, match="must not exceed PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.6"):
        ApplePlatform().check_config(engine_config(dtype="auto"))
    monkeypatch.setenv(LOW, "0.6")
    assert ApplePlatform().check_config(engine_config(dtype="auto")) == {}
