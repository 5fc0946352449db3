"""Cheap, side-effect-free detection of a usable NVIDIA GPU.

Answers "can this machine run the cuda platform?" without importing torch: the torch
build is read from ``torch/version.py`` (found with ``importlib.util.find_spec``) and
the device from the driver's files (``/dev/nvidia<N>``, ``/proc/driver/nvidia/gpus``).
"""

from __future__ import annotations

import ast
import glob
import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_ASSIGNMENT = re.compile(r"^(__version__|cuda|hip)\s*(?::[^=]*)?=\s*(.+)$")


@dataclass(frozen=True)
class TorchBuild:
    """What the installed torch was built for, read from its ``version.py``."""

    version: str
    cuda: str | None
    hip: str | None


def parse_torch_version_file(text: str) -> TorchBuild:
    """Parse the ``__version__``, ``cuda`` and ``hip`` assignments of ``torch/version.py``."""
    values: dict[str, str | None] = {}
    for line in text.splitlines():
        match = _ASSIGNMENT.match(line.strip())
        if match is None:
            continue
        try:
            value = ast.literal_eval(match.group(2).strip())
        except (ValueError, SyntaxError):
            continue  # an expression, not a literal: not something we rely on
        values[match.group(1)] = value if isinstance(value, str) else None
    return TorchBuild(version=values.get("__version__") or "unknown", cuda=values.get("cuda"), hip=values.get("hip"))


def find_torch_build() -> TorchBuild | None:
    """The installed torch's build, or None when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version_file = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        return parse_torch_version_file(version_file.read_text())
    except OSError:
        return TorchBuild(version="unknown", cuda=None, hip=None)


def nvidia_device_nodes(root: str = "/") -> list[str]:
    """Paths that show an NVIDIA GPU to this process (device nodes or driver entries)."""
    nodes = glob.glob(os.path.join(root, "dev", "nvidia[0-9]*"))
    nodes += glob.glob(os.path.join(root, "proc", "driver", "nvidia", "gpus", "*"))
    return sorted(nodes)


def _hidden_by_visible_devices(environ: Mapping[str, str]) -> bool:
    value = environ.get("CUDA_VISIBLE_DEVICES")
    return value is not None and value.strip() in ("", "-1")


def unavailable_reason(build: TorchBuild | None, device_nodes: list[str], environ: Mapping[str, str]) -> str | None:
    """Why the cuda platform cannot run, or None when it can (pure: inputs are given)."""
    if build is None:
        return "torch is not installed"
    if build.hip is not None:
        return f"torch {build.version} is a ROCm/HIP build (use the rocm platform)"
    if build.cuda is None:
        return f"torch {build.version} is a CPU-only build"
    if _hidden_by_visible_devices(environ):
        return f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r} hides every device"
    if not device_nodes:
        return "no NVIDIA device found (no /dev/nvidia<N> or /proc/driver/nvidia/gpus)"
    return None


def probe(environ: Mapping[str, str] | None = None) -> str | None:
    """Look at this machine: None when usable, else the reason. Never raises."""
    try:
        return unavailable_reason(find_torch_build(), nvidia_device_nodes(), os.environ if environ is None else environ)
    except Exception as exc:  # detection must never break discovery
        return f"detection failed: {type(exc).__name__}: {exc}"
