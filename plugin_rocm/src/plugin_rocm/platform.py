"""The AMD GPU backend: a HIP build of torch and the ROCm kernel driver (/dev/kfd).

Detection reads ``torch/version.py`` as text (its ``hip`` field is a version string
in ROCm builds, None otherwise) and the KFD topology in sysfs, so it costs no torch
import. torch exposes HIP devices as ``"cuda"`` and RCCL as the ``"nccl"`` backend.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
from typing import Any

import plugins
from plugins import EnvVar
from plugins.env import parse_fraction
from plugins.host import read_text
from plugins.memory import DeviceMemoryProfiler, GiB

from plugin_rocm.visible import device_env

logger = logging.getLogger(__name__)

KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def torch_hip_version(version_py: str) -> str | None:
    """The ``hip`` version recorded in ``torch/version.py`` text, or None (not a HIP build)."""
    found = re.search(r"^hip\s*(?::[^=\n]*)?=\s*['\"]([^'\"]+)['\"]", version_py, re.MULTILINE)
    return found.group(1) if found else None


def installed_torch_version_py() -> str:
    """Text of the installed ``torch/version.py`` (found, not imported), or ``""``."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return read_text(os.path.join(next(iter(spec.submodule_search_locations)), "version.py"))


def kfd_gpus(nodes_dir: str = KFD_NODES) -> list[dict[str, Any]]:
    """The GPU agents of the KFD topology (CPU nodes have ``simd_count 0``)."""
    gpus = []
    for node in sorted(glob.glob(os.path.join(nodes_dir, "*"))):
        props = dict(
            line.split(None, 1) for line in read_text(os.path.join(node, "properties")).splitlines() if " " in line
        )
        if int(props.get("simd_count", "0")) == 0:
            continue
        target = int(props.get("gfx_target_version", "0"))
        memory = sum(
            int(
                dict(line.split(None, 1) for line in read_text(bank).splitlines() if " " in line).get(
                    "size_in_bytes", "0"
                )
            )
            for bank in glob.glob(os.path.join(node, "mem_banks", "*", "properties"))
        )
        name = read_text(os.path.join(node, "name")).strip()
        gfx = f"gfx{target // 10000}{target // 100 % 100:x}{target % 100:x}" if target else "unknown"
        gpus.append({"name": name or gfx, "gfx": gfx, "memory_gib": round(memory / GiB, 1)})
    return gpus


def probe(hip_version: str | None, has_torch: bool, has_kfd: bool, num_gpus: int) -> str | None:
    """Why the platform is unavailable, or None."""
    if not has_torch:
        return "torch is not installed"
    if hip_version is None:
        return "torch is not a ROCm (HIP) build: torch.version.hip is None"
    if not has_kfd:
        return "no ROCm kernel driver: /dev/kfd is missing (amdgpu not loaded, or not passed to the container)"
    if num_gpus == 0:
        return "/dev/kfd present but the KFD topology lists no GPU"
    return None


class RocmMemoryProfiler(DeviceMemoryProfiler):
    """GPU memory through ``torch.cuda`` (HIP); KV budget = total * utilization - used."""

    torch_module = "cuda"
    utilization_var = "ROCM_GPU_MEMORY_UTILIZATION"


class RocmPlatform(plugins.Platform):
    """AMD Instinct / Radeon GPUs through torch's HIP build."""

    name = "rocm"
    device_type = "cuda"  # HIP devices are torch's "cuda" devices
    priority = 100
    api_version = 2
    supported_dtypes = ("bfloat16", "float16", "float32")
    distributed_backend = "nccl"  # torch's name for RCCL on ROCm
    ray_device_key = "GPU"
    env_vars = (
        EnvVar("ROCM_GPU_MEMORY_UTILIZATION", parse_fraction, None, "share of GPU memory for weights, activations and KV cache; when set it wins over --gpu-memory-utilization"),
        EnvVar("ROCM_VISIBLE_DEVICES", str, None, "GPU indices to use, exported as HIP_VISIBLE_DEVICES before HIP starts"),
    )  # fmt: skip

    def _state(self) -> tuple[str | None, list[dict[str, Any]], str | None]:
        version_py = installed_torch_version_py()
        hip = torch_hip_version(version_py)
        gpus = kfd_gpus() if os.path.exists("/dev/kfd") else []
        return probe(hip, bool(version_py), os.path.exists("/dev/kfd"), len(gpus)), gpus, hip

    def unavailable_reason(self) -> str | None:
        return self._state()[0]

    def device_info(self) -> dict[str, Any]:
        _, gpus, hip = self._state()
        return {
            "name": ", ".join(sorted({g["name"] for g in gpus})) or None,
            "count": len(gpus),
            "gpus": gpus,
            "hip": hip,
        }

    def init_device(self, config: plugins.EngineConfigView) -> None:
        os.environ.update(device_env(self.env["ROCM_VISIBLE_DEVICES"], os.environ))
        import torch

        torch.cuda.set_device(config.local_rank)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def make_memory_profiler(self):
        return RocmMemoryProfiler(self)
