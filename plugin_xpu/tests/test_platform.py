"""XPU detection from torch/version.py text and the selectors, the dtype rule, memory, env, kernels."""

from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest
import torch
from plugin_xpu.platform import (
    XpuMemoryProfiler,
    XpuPlatform,
    installed_torch_version_py,
    is_data_center_gpu,
    probe,
    torch_version_field,
)
from plugins import EnvConfigError
from plugins.memory import GiB

CPU_BUILD = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\nxpu: Optional[str] = None\n"
XPU_BUILD = "__version__ = '2.9.0+xpu'\ncuda: Optional[str] = None\nxpu: Optional[str] = '20250101'\n"
OLD_BUILD = "__version__ = '2.1.0'\ncuda = None\nhip = None\n"  # before torch.version.xpu existed
MAX = SimpleNamespace(
    name="Intel(R) Data Center GPU Max 1550", total_memory=64 * GiB, gpu_subslice_count=64, driver_version="1.6.32567"
)
ARC = SimpleNamespace(
    name="Intel(R) Arc(TM) A770 Graphics", total_memory=16 * GiB, gpu_subslice_count=32, driver_version="1.3.29735"
)


def never_called() -> int:
    raise AssertionError("device_count must not be asked without an XPU build")


def test_version_fields_from_text():
    assert torch_version_field(XPU_BUILD, "xpu") == "20250101"
    assert torch_version_field(XPU_BUILD, "__version__") == "2.9.0+xpu"
    assert torch_version_field(CPU_BUILD, "xpu") is None
    assert torch_version_field(OLD_BUILD, "xpu") is None


def test_probe_reasons():
    assert probe(None, {}, never_called) == "torch is not installed"
    assert probe(CPU_BUILD, {}, never_called).startswith(
        "torch 2.13.0+cpu is not an XPU build (torch.version.xpu is None; Intel GPU wheels: https://download"
    )
    assert probe(OLD_BUILD, {}, never_called).startswith("torch 2.1.0 is not an XPU build")
    hidden = probe(XPU_BUILD, {"ONEAPI_DEVICE_SELECTOR": "opencl:gpu"}, never_called)
    assert hidden.startswith("ONEAPI_DEVICE_SELECTOR='opencl:gpu' leaves no Level Zero GPU")
    assert "is not a device index" in probe(XPU_BUILD, {"ZE_AFFINITY_MASK": "first"}, never_called)
    assert "torch.xpu.device_count() is 0" in probe(XPU_BUILD, {}, lambda: 0)
    assert probe(XPU_BUILD, {"ONEAPI_DEVICE_SELECTOR": "level_zero:0"}, lambda: 1) is None


def test_this_machine_never_raises():
    plat = XpuPlatform()
    reason = plat.unavailable_reason()
    if not torch.xpu.is_available():
        assert plat.is_available() is False and plat.device_info() == {}
        if torch_version_field(installed_torch_version_py() or "", "xpu") is None:
            assert f"torch {torch.__version__} is not an XPU build" in reason
    else:
        assert reason is None and plat.device_info()["count"] >= 1


def test_discovered_through_the_entry_point():
    (found,) = [ep for ep in entry_points(group="core.platforms") if ep.name == "xpu"]
    assert found.load().register_platform() is XpuPlatform


def test_identity_and_dtypes():
    assert (XpuPlatform.name, XpuPlatform.device_type, XpuPlatform.priority) == ("xpu", "xpu", 100)
    assert XpuPlatform.supported_dtypes[0] == "float16"  # the auto dtype, as vLLM's XPU backend
    assert (XpuPlatform.distributed_backend, XpuPlatform.ray_device_key) == ("xccl", "GPU")


class OnDevice(XpuPlatform):
    """The platform as it answers with ``gpus`` visible (device properties faked)."""

    gpus = (MAX,)

    @property
    def _probe(self) -> None:
        return None

    def _properties(self):
        return list(self.gpus)


def test_bfloat16_only_on_data_center_gpus():
    assert is_data_center_gpu(MAX.name) and not is_data_center_gpu(ARC.name)
    plat = OnDevice()
    for dtype in ("auto", "float16", "bfloat16", "float32"):
        assert plat.check_config(SimpleNamespace(dtype=dtype)) == {}
    plat.gpus = (MAX, ARC)
    with pytest.raises(ValueError, match=r"Data Center GPUs \(Max, Flex\) only, not on Intel\(R\) Arc\(TM\) A770"):
        plat.check_config(SimpleNamespace(dtype="bfloat16"))
    assert plat.check_config(SimpleNamespace(dtype="auto")) == {}


def test_device_info(monkeypatch):
    monkeypatch.setenv("ZE_AFFINITY_MASK", "0")
    monkeypatch.delenv("ONEAPI_DEVICE_SELECTOR", raising=False)
    info = OnDevice().device_info()
    assert {k: info[k] for k in ("name", "count", "memory_gib", "xe_cores", "driver", "bfloat16", "selectors")} == {
        "name": MAX.name, "count": 1, "memory_gib": 64.0, "xe_cores": 64, "driver": "1.6.32567",
        "bfloat16": True, "selectors": {"ZE_AFFINITY_MASK": "0"},
    }  # fmt: skip


def test_kernels_are_the_shared_triton_ones_without_the_skinny_gemm():
    from plugins.gpu_triton.kernels import TritonKernels

    kernels = OnDevice().make_kernels()
    assert type(kernels) is TritonKernels
    assert (kernels.attention_backend, kernels.ops_backend, kernels.skinny_gemm, kernels.num_sms) == (
        "triton", "triton", None, 64,
    )  # fmt: skip


def test_env_values(monkeypatch):
    plat = XpuPlatform()
    assert plat.read_env({"VLLM_XPU_GPU_MEMORY_UTILIZATION": "0.8"})["XPU_GPU_MEMORY_UTILIZATION"] == 0.8
    assert plat.read_env({})["XPU_KERNELS"] == "triton"
    assert plat.read_env({"CORE_XPU_VISIBLE_DEVICES": "0.1"})["XPU_VISIBLE_DEVICES"] == "0.1"
    for name, bad in (("XPU_GPU_MEMORY_UTILIZATION", "1.5"), ("XPU_KERNELS", "sycl")):
        with pytest.raises(EnvConfigError, match=f"CORE_{name}"):
            plat.read_env({f"CORE_{name}": bad})
    monkeypatch.setenv("CORE_XPU_KERNELS", "reference")
    kernels = OnDevice().make_kernels()
    assert (kernels.attention_backend, kernels.ops_backend) == ("reference", "reference")


class FakeXpu:
    """``torch.xpu``'s memory calls on a 64 GiB card with 20 GiB allocated, 3 GiB more at peak."""

    def __init__(self) -> None:
        self.allocated, self.peak = 20 * GiB, 20 * GiB

    def mem_get_info(self):
        return 64 * GiB - self.allocated, 64 * GiB

    def memory_allocated(self):
        return self.allocated

    def max_memory_allocated(self):
        return self.peak

    def reset_peak_memory_stats(self):
        self.peak = self.allocated

    def synchronize(self):
        pass


def test_memory_through_torch_xpu(monkeypatch):
    assert XpuMemoryProfiler.torch_module == "xpu"
    fake = FakeXpu()
    profiler = XpuMemoryProfiler(XpuPlatform(), device=fake)
    assert (profiler.total_memory(), profiler.free_memory()) == (64 * GiB, 44 * GiB)

    def profile():
        fake.peak = fake.allocated + 3 * GiB

    assert profiler.measure_peak(profile) == 3 * GiB
    monkeypatch.setenv("CORE_XPU_GPU_MEMORY_UTILIZATION", "0.5")
    assert profiler.utilization(SimpleNamespace(gpu_memory_utilization=0.9)) == (0.5, "CORE_XPU_GPU_MEMORY_UTILIZATION")
    monkeypatch.delenv("CORE_XPU_GPU_MEMORY_UTILIZATION")
    assert profiler.utilization(SimpleNamespace(gpu_memory_utilization=0.9)) == (0.9, "gpu_memory_utilization")
