"""The Intel Gaudi backend: habana_frameworks installed and a Gaudi device present."""

from __future__ import annotations

import glob
import importlib.util
import logging
from typing import Any

import plugins
from plugins import EnvVar
from plugins.env import parse_share
from plugins.memory import DeviceMemoryProfiler

from plugin_hpu.bucketing import DIMENSIONS, STRATEGIES
from plugin_hpu.graph_memory import MemoryPlan, plan_memory

logger = logging.getLogger(__name__)

DEVICE_GLOBS = ("/dev/accel/accel[0-9]*", "/dev/hl[0-9]*")


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


class HpuMemoryProfiler(DeviceMemoryProfiler):
    """Gaudi memory through ``torch.hpu``; the KV budget leaves ``GRAPH_RESERVED_MEM`` for graphs."""

    torch_module = "hpu"
    #: the split of the last KV plan; the runner keeps its margin free when capturing graphs
    plan: MemoryPlan | None = None

    def device_budget(
        self, config: plugins.EngineConfigView, peak_activation_bytes: int, utilization: float
    ) -> tuple[int, str]:
        reserved = self.platform.env["GRAPH_RESERVED_MEM"]
        self.plan = plan_memory(self.free_memory() - peak_activation_bytes, utilization, reserved, config.enforce_eager)
        return self.plan.kv_cache_bytes, self.plan.describe(utilization, reserved)


class HpuPlatform(plugins.Platform):
    """Gaudi through the HPU PyTorch bridge: bucketed shapes, warm-up and HPU graphs."""

    name = "hpu"
    device_type = "hpu"
    priority = 90
    api_version = 2
    supported_dtypes = ("bfloat16", "float32")
    distributed_backend = "hccl"
    ray_device_key = "HPU"
    env_vars = _bucket_vars() + (
        EnvVar("SKIP_WARMUP", bool, False, "skip compiling every bucket before serving (first use compiles instead)"),
        EnvVar("GRAPH_RESERVED_MEM", parse_share, 0.1, "share of usable device memory reserved for HPU graphs"),
        EnvVar(
            "GRAPH_PROMPT_RATIO", parse_share, 0.3, "share of the graph memory for prompt graphs (the rest: decode)"
        ),
        EnvVar("GRAPH_PROMPT_STRATEGY", str, "min_tokens", "prompt graph capture order", STRATEGIES),
        EnvVar("GRAPH_DECODE_STRATEGY", str, "max_bs", "decode graph capture order", STRATEGIES),
    )

    def unavailable_reason(self) -> str | None:
        has_habana = importlib.util.find_spec("habana_frameworks") is not None
        return probe(has_habana, sorted(p for pattern in DEVICE_GLOBS for p in glob.glob(pattern)))

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

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        overrides: dict[str, Any] = {}
        if config.enable_chunked_prefill:
            overrides["enable_chunked_prefill"] = False  # HPU runs prompts and decodes in separate batches
        if config.block_size % 128:
            logger.warning("block_size %s underuses Gaudi's matrix engines; 128 is recommended", config.block_size)
        if config.dtype == "float16":
            raise ValueError("HPU runs bfloat16 or float32, got dtype='float16'")
        return overrides

    def init_device(self, config: plugins.EngineConfigView) -> None:
        import habana_frameworks.torch.core  # noqa: F401  (registers the "hpu" device with torch)

    def synchronize(self) -> None:
        import torch

        torch.hpu.synchronize()

    def make_memory_profiler(self):
        return HpuMemoryProfiler(self)

    def make_runner(self):
        from plugin_hpu.runner import HpuRunner

        return HpuRunner(self)
