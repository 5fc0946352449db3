"""The OpenVINO platform's own parts: lazy import, availability, config, env variables, discovery."""

import subprocess
import sys

import pytest
import torch
from plugin_openvino.platform import OpenVinoPlatform
from plugins.kv_cache import KVCacheLayout
from plugins.reference import engine_config


def test_entry_point_module_does_not_import_openvino():
    code = "import sys, plugin_openvino; plugin_openvino.register_platform(); print('openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unavailable_without_openvino(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "openvino" else real(name, *a))
    assert OpenVinoPlatform().unavailable_reason() == "openvino is not installed (pip install openvino)"


def test_gpu_device_is_unavailable_with_its_reason(monkeypatch):
    monkeypatch.setenv("CORE_OPENVINO_DEVICE", "GPU")
    reason = OpenVinoPlatform().unavailable_reason()
    assert reason is not None and "OPENVINO_DEVICE=GPU" in reason


def test_block_size_forced_to_32():
    assert OpenVinoPlatform().check_config(engine_config(block_size=16)) == {"block_size": 32}
    assert OpenVinoPlatform().check_config(engine_config(block_size=32)) == {}


@pytest.mark.parametrize("precision,kv", [("bf16", "bfloat16"), ("u8", "auto")])
def test_kv_cache_precision(monkeypatch, precision, kv):
    monkeypatch.setenv("VLLM_OPENVINO_CPU_KV_CACHE_PRECISION", precision)
    config = engine_config(block_size=32, dtype="bfloat16")
    assert OpenVinoPlatform().check_config(config)["kv_cache_dtype"] == kv


@pytest.mark.parametrize("precision", ["f32", "u8"])
def test_float32_compute_takes_f32_or_u8_caches(monkeypatch, precision):
    monkeypatch.setenv("VLLM_OPENVINO_CPU_KV_CACHE_PRECISION", precision)
    assert OpenVinoPlatform().check_config(engine_config(block_size=32, dtype="float32"))["kv_cache_dtype"] == "auto"


@pytest.mark.parametrize(
    "precision,kv_cache_dtype,dtype",
    [("bf16", "auto", "float32"), ("f16", "auto", "float32"), ("", "bfloat16", "auto"), ("f16", "auto", "bfloat16")],
)
def test_caches_openvino_cannot_compile_are_refused(monkeypatch, precision, kv_cache_dtype, dtype):
    """OpenVINO's CPU PagedAttention refuses them ("expect kvcache type f32"; f16 under bf16:
    "Parameter operation with dynamic rank")."""
    monkeypatch.setenv("VLLM_OPENVINO_CPU_KV_CACHE_PRECISION", precision)
    config = engine_config(block_size=32, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    with pytest.raises(ValueError, match="compute: OpenVINO's CPU PagedAttention takes only a KV cache of the compute"):
        OpenVinoPlatform().check_config(config)


def test_refused_settings():
    with pytest.raises(ValueError, match="LoRA"):
        OpenVinoPlatform().check_config(engine_config(enable_lora=True))


def test_u8_kv_cache_layout(monkeypatch):
    """u8: OpenVINO's blocks (heads first, key scale rows, value scale bytes), 1.7x smaller than bf16;
    other precisions keep the standard layout (a model the graph cannot build runs eagerly on it)."""
    config = engine_config(block_size=32, kv_cache_dtype="bfloat16")
    bf16 = OpenVinoPlatform().kv_cache_layout(config, 3, 64)
    assert bf16 == KVCacheLayout.standard(32, 3, 64, torch.bfloat16)
    monkeypatch.setenv("CORE_OPENVINO_CPU_KV_CACHE_PRECISION", "u8")
    plat = OpenVinoPlatform()
    assert plat.check_config(engine_config(block_size=32))["kv_cache_dtype"] == "auto"
    u8 = plat.kv_cache_layout(config, 3, 64)
    assert u8.shapes(4) == ((4, 3, 40, 64), (4, 3, 32, 72)) and u8.dtype == torch.uint8
    assert round(bf16.block_bytes / u8.block_bytes, 2) == 1.68


def test_u8_kv_cache_on_a_model_the_graph_cannot_build_is_refused(monkeypatch):
    monkeypatch.setenv("CORE_OPENVINO_CPU_KV_CACHE_PRECISION", "u8")
    plat = OpenVinoPlatform()
    caches = [(torch.zeros(2, 3, 40, 64, dtype=torch.uint8), torch.zeros(2, 3, 32, 72, dtype=torch.uint8))]
    with pytest.raises(ValueError, match="only the OpenVINO graph reads u8 blocks"):
        plat.make_runner().prepare(torch.nn.Linear(2, 2), caches, engine_config(block_size=32))


def test_kvcache_space_wins(monkeypatch):
    monkeypatch.setenv("VLLM_OPENVINO_KVCACHE_SPACE", "0.25")
    plat = OpenVinoPlatform()
    budget, why = plat.memory.kv_cache_budget(engine_config(kv_cache_bytes=1 << 20), 0)
    assert budget == 1 << 28 and "OPENVINO_KVCACHE_SPACE" in why


def test_quantized_weights_switch(monkeypatch):
    assert "gguf" in OpenVinoPlatform().kernels.supported_quantizations
    monkeypatch.setenv("CORE_OPENVINO_ENABLE_QUANTIZED_WEIGHTS", "0")
    assert "gguf" not in OpenVinoPlatform().kernels.supported_quantizations


def test_core_devices_lists_it_available():
    out = subprocess.run([sys.executable, "-m", "core.cli", "devices"], capture_output=True, text=True)
    line = next(row for row in out.stdout.splitlines() if row.startswith("openvino "))
    assert "available" in line and "unavailable" not in line, line
    cpu_x86 = next((row for row in out.stdout.splitlines() if row.startswith("cpu_x86 ")), "")
    if "available" in cpu_x86 and "unavailable" not in cpu_x86:
        assert OpenVinoPlatform.priority < int(cpu_x86.split()[3])


def test_dynamic_quantization_is_off_unless_asked(monkeypatch):
    assert OpenVinoPlatform().compile_properties(torch.float32, "f32")["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
    monkeypatch.setenv("CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE", "32")
    properties = OpenVinoPlatform().compile_properties(torch.bfloat16, "u8")
    assert properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 32 and properties["KEY_CACHE_QUANT_MODE"] == "BY_CHANNEL"


@pytest.mark.parametrize(
    ("group_size", "integer_zero_points", "split", "form"),
    [
        ("0", "0", "auto", "f16"),
        ("32", "0", "auto", "split"),
        ("32", "0", "0", "f16"),
        ("0", "0", "1", "split"),
        ("0", "1", "auto", "round"),
        ("32", "1", "0", "round"),
    ],
)
def test_q4_1_form(monkeypatch, group_size, integer_zero_points, split, form):
    """Exact unless rounded zero points are asked for; split under int8 activations unless told."""
    monkeypatch.setenv("CORE_OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE", group_size)
    monkeypatch.setenv("CORE_OPENVINO_Q4_1_INTEGER_ZERO_POINTS", integer_zero_points)
    monkeypatch.setenv("CORE_OPENVINO_Q4_1_SPLIT", split)
    assert OpenVinoPlatform().q4_1_form() == form


def test_rounded_and_split_q4_1_together_are_refused(monkeypatch):
    monkeypatch.setenv("CORE_OPENVINO_Q4_1_INTEGER_ZERO_POINTS", "1")
    monkeypatch.setenv("CORE_OPENVINO_Q4_1_SPLIT", "1")
    with pytest.raises(ValueError, match="choose one Q4_1 form"):
        OpenVinoPlatform().q4_1_form()
