"""Detection, identity, env config and config checks of the cuda platform."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
from plugin_cuda.platform import CudaPlatform
from plugins import EnvConfigError

from plugin_cuda import detect, register_platform

CPU_VERSION_PY = """from typing import Optional
__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '2.13.0+cpu'
debug = False
cuda: Optional[str] = None
hip: Optional[str] = None
"""


def test_parse_torch_version_file_builds() -> None:
    cpu = detect.parse_torch_version_file(CPU_VERSION_PY)
    assert cpu == detect.TorchBuild("2.13.0+cpu", None, None)
    cuda = detect.parse_torch_version_file(CPU_VERSION_PY.replace("cuda: Optional[str] = None", "cuda = '12.8'"))
    assert cuda.cuda == "12.8" and cuda.hip is None
    hip = detect.parse_torch_version_file(
        CPU_VERSION_PY.replace("hip: Optional[str] = None", "hip: Optional[str] = '6.3.1'")
    )
    assert hip.hip == "6.3.1"


@pytest.mark.parametrize(
    "build,nodes,environ,reason",
    [
        (None, ["/dev/nvidia0"], {}, "torch is not installed"),
        (detect.TorchBuild("2.13.0+cpu", None, None), ["/dev/nvidia0"], {}, "torch 2.13.0+cpu is a CPU-only build"),
        (
            detect.TorchBuild("2.6.0+rocm6.3", None, "6.3"),
            ["/dev/nvidia0"],
            {},
            "torch 2.6.0+rocm6.3 is a ROCm/HIP build",
        ),
        (detect.TorchBuild("2.8.0+cu128", "12.8", None), [], {}, "no NVIDIA device found"),
        (
            detect.TorchBuild("2.8.0+cu128", "12.8", None),
            ["/dev/nvidia0"],
            {"CUDA_VISIBLE_DEVICES": ""},
            "hides every device",
        ),
        (detect.TorchBuild("2.8.0+cu128", "12.8", None), ["/dev/nvidia0"], {"CUDA_VISIBLE_DEVICES": "0"}, None),
    ],
)
def test_unavailable_reason(build, nodes, environ, reason) -> None:
    got = detect.unavailable_reason(build, nodes, environ)
    if reason is None:
        assert got is None
    else:
        assert got is not None and reason in got


def test_device_nodes_found_under_root(tmp_path) -> None:
    assert detect.nvidia_device_nodes(str(tmp_path)) == []
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    (tmp_path / "dev" / "nvidiactl").touch()  # the control node is not a device
    assert detect.nvidia_device_nodes(str(tmp_path)) == [str(tmp_path / "dev" / "nvidia0")]


def test_this_machine_matches_torch() -> None:
    import torch

    plat = CudaPlatform()
    assert plat.is_available() is torch.cuda.is_available()
    if not plat.is_available():
        reason = plat.unavailable_reason()
        assert reason and ("CPU-only build" in reason or "no NVIDIA device" in reason or "hides" in reason)
        assert plat.device_info() == {}
        assert plat.check_config(SimpleNamespace(dtype="bfloat16")) == {}


def test_identity_and_entry_point() -> None:
    assert register_platform() is CudaPlatform
    plat = CudaPlatform()
    assert (plat.name, plat.device_type, plat.priority) == ("cuda", "cuda", 100)
    assert plat.distributed_backend == "nccl"
    assert plat.supported_dtypes == ("bfloat16", "float16", "float32")
    found = {ep.name: ep.value for ep in entry_points(group="core.platforms")}
    assert found.get("cuda") == "plugin_cuda"


def test_import_and_detection_do_not_import_torch() -> None:
    code = (
        "import sys, plugin_cuda; from plugin_cuda.platform import CudaPlatform; "
        "p = CudaPlatform(); p.is_available(); p.unavailable_reason(); "
        "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_env_parsing() -> None:
    plat = CudaPlatform()
    env = plat.read_env({})
    assert env == {
        "CUDA_GRAPH_SIZES": None,
        "GPU_MEMORY_UTILIZATION": 0.9,
        "CUDA_ATTENTION_BACKEND": "triton",
        "CUDA_KERNELS": "triton",
        "CUDA_SKINNY_GEMM": "cublas",
        "CUDA_DECODE_SPLIT_TOKENS": 256,
    }
    got = plat.read_env({"CORE_CUDA_GRAPH_SIZES": "8, 1,2,8", "VLLM_GPU_MEMORY_UTILIZATION": "0.5"})
    assert got["CUDA_GRAPH_SIZES"] == (1, 2, 8)
    assert got["GPU_MEMORY_UTILIZATION"] == 0.5


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("CORE_CUDA_GRAPH_SIZES", "1,two", "CORE_CUDA_GRAPH_SIZES='1,two'"),
        ("CORE_CUDA_GRAPH_SIZES", "0,4", "must be positive"),
        ("CORE_GPU_MEMORY_UTILIZATION", "1.5", "fraction in \\(0, 1\\]"),
        ("VLLM_GPU_MEMORY_UTILIZATION", "lots", "VLLM_GPU_MEMORY_UTILIZATION"),
        ("CORE_CUDA_ATTENTION_BACKEND", "flash", "is not one of: triton, reference"),
        ("CORE_CUDA_DECODE_SPLIT_TOKENS", "100", "multiple of 16"),
        ("CORE_CUDA_SKINNY_GEMM", "cutlass", "is not one of: auto, triton, cublas"),
    ],
)
def test_env_bad_values(name, text, message) -> None:
    with pytest.raises(EnvConfigError, match=message):
        CudaPlatform().read_env({name: text})


@pytest.mark.gpu
def test_device_info_and_bf16_check_on_gpu() -> None:
    plat = CudaPlatform()
    info = plat.device_info()
    assert info["count"] >= 1 and info["memory_gib"] > 0 and "." in info["compute_capability"]
    major, _ = plat.compute_capability()
    if major >= 8:
        assert plat.check_config(SimpleNamespace(dtype="bfloat16")) == {}
    else:
        assert plat.check_config(SimpleNamespace(dtype="auto")) == {"dtype": "float16"}
        with pytest.raises(ValueError, match="compute capability"):
            plat.check_config(SimpleNamespace(dtype="bfloat16"))
