"""The Intel Gaudi backend: habana_frameworks installed and a Gaudi device present."""

from __future__ import annotations

import glob
import importlib.util
import logging
from typing import Any

import plugins
from plugins import EnvVar
from plugins.memory import MemoryProfiler

from plugin_hpu.bucketing import DIMENSIONS, STRATEGIES
from plugin_hpu.graph_memory import plan_memory

logger = logging.getLogger(__name__)

DEVICE_GLOBS = ("/dev/accel/accel[0-9]*", "/dev/hl[0-9]*")


def fraction(text: str) -> float:
    """Parse a number in [0, 1]."""
    value = float(text)
    if not 0 <= value <= 1:
        raise ValueError("expected a number between 0 and 1")
    return value


def _bucket_vars() -> tuple[EnvVar, ...]:
    helps = {"MIN": "smallest bucket", "STEP": "linear step after the doubling ramp-up", "MAX": "largest bucket"}
    return tuple(
        EnvVar(f"{phase}_{dim}_BUCKET_{param}", int, None, f"{phase.lower()} {dim.lower()} {text} (default: vLLM's, from the engine config)")
        for phase, dim in DIMENSIONS
        for param, text in helps.items()
    )  # fmt: skip


def probe(has_habana: bool, devices: list[str]) -> str | None:
    """Why the platform is unavailable, or None, from the package check and device nodes."""
    if not has_habana:
        return "habana_frameworks is not installed (Intel Gaudi software stack)"
    if not devices:
        return "no Gaudi device found (/dev/accel/accel* or /dev/hl*)"
    return None


class HpuMemoryProfiler(MemoryProfiler):
    """Gaudi memory through ``torch.hpu``; the KV budget leaves ``GRAPH_RESERVED_MEM`` for graphs."""

    def total_memory(self) -> int:
        import torch

        return torch.hpu.mem_get_info()[1]

    def free_memory(self) -> int:
        import torch

        return torch.hpu.mem_get_info()[0]

    def measure_peak(self, profile_fn) -> int:
        import torch

        torch.hpu.reset_peak_memory_stats()
        before = torch.hpu.memory_allocated()
        profile_fn()
        return max(0, torch.hpu.max_memory_allocated() - before)

    def kv_cache_budget(self, config: Any, peak_activation_bytes: int) -> tuple[int, str]:
        if getattr(config, "kv_cache_bytes", None):
            return super().kv_cache_budget(config, peak_activation_bytes)
        env = self.platform.env
        util = getattr(config, "gpu_memory_utilization", 0.9)
        plan = plan_memory(
            self.free_memory() - peak_activation_bytes,
            util,
            env["GRAPH_RESERVED_MEM"],
            getattr(config, "enforce_eager", False),
        )
        return plan.kv_cache_bytes, plan.describe(util, env["GRAPH_RESERVED_MEM"])


class HpuPlatform(plugins.Platform):
    """Gaudi through the HPU PyTorch bridge: bucketed shapes, warm-up and HPU graphs."""

    name = "hpu"
    device_type = "hpu"
    priority = 90
    api_version = 1
    supported_dtypes = ("bfloat16", "float32")
    distributed_backend = "hccl"
    env_vars = _bucket_vars() + (
        EnvVar("SKIP_WARMUP", bool, False, "skip compiling every bucket before serving (first use compiles instead)"),
        EnvVar("GRAPH_RESERVED_MEM", fraction, 0.1, "share of usable device memory reserved for HPU graphs"),
        EnvVar("GRAPH_PROMPT_RATIO", fraction, 0.3, "share of the graph memory for prompt graphs (the rest: decode)"),
        EnvVar("GRAPH_PROMPT_STRATEGY", str, "min_tokens", "prompt graph capture order", STRATEGIES),
        EnvVar("GRAPH_DECODE_STRATEGY", str, "max_bs", "decode graph capture order", STRATEGIES),
    )

    def _reason(self) -> str | None:
        has_habana = importlib.util.find_spec("habana_frameworks") is not None
        return probe(has_habana, sorted(p for pattern in DEVICE_GLOBS for p in glob.glob(pattern)))

    def is_available(self) -> bool:
        return self._reason() is None

    def unavailable_reason(self) -> str | None:
        return self._reason()

    def device_info(self) -> dict[str, Any]:
        devices = sorted(p for pattern in DEVICE_GLOBS for p in glob.glob(pattern))
        kinds = set()
        for path in glob.glob("/sys/class/accel/accel*/device/device_type"):
            try:
                with open(path) as f:
                    kinds.add(f.read().strip())
            except OSError:  # a device node that went away: report the rest
                continue
        return {"name": ", ".join(sorted(kinds)) or "Gaudi", "count": len(devices), "devices": devices}

    def check_config(self, config: Any) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if getattr(config, "enable_chunked_prefill", False):
            overrides["enable_chunked_prefill"] = False  # HPU runs prompts and decodes in separate batches
        if getattr(config, "block_size", 128) % 128:
            logger.warning("block_size %s underuses Gaudi's matrix engines; 128 is recommended", config.block_size)
        if getattr(config, "dtype", "auto") == "float16":
            raise ValueError("HPU runs bfloat16 or float32, got dtype='float16'")
        return overrides

    def init_device(self, config: Any) -> None:
        import habana_frameworks.torch.core  # noqa: F401  (registers the "hpu" device with torch)

    def synchronize(self) -> None:
        import torch

        torch.hpu.synchronize()

    def make_memory_profiler(self):
        return HpuMemoryProfiler(self)

    def make_runner(self):
        from plugin_hpu.runner import HpuRunner

        return HpuRunner(self)
