"""The OpenVINO platform: core's models as one compiled OpenVINO model (:mod:`plugin_openvino.runner`).

A host-CPU platform (:class:`plugins.cpu.CpuPlatform`: thread binding, the ``CPU_*``
variables) whose runner hands every step to the OpenVINO runtime, with vLLM's OpenVINO
variables (``OPENVINO_DEVICE``, ``OPENVINO_KVCACHE_SPACE``, ``OPENVINO_CPU_KV_CACHE_PRECISION``,
``OPENVINO_ENABLE_QUANTIZED_WEIGHTS``; read as ``CORE_*``, else ``VLLM_*``). Its priority is
below cpu_x86's: ``--device auto`` keeps the faster native kernels where both run.
"""

from __future__ import annotations

import importlib.util
import logging
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from plugins.config import DTYPE_ALIASES, EngineConfigView
from plugins.cpu import CPU_ENV_VARS, CpuMemoryProfiler, CpuPlatform, non_negative
from plugins.env import EnvVar
from plugins.host import process_cpus
from plugins.kv_cache import KVCacheLayout

logger = logging.getLogger(__name__)

#: OpenVINO's CPU PagedAttention reads the cache in blocks of this many tokens
OPENVINO_BLOCK_SIZE = 32
#: a u8 cache's scale and zero point (two float32) as bytes: rows after each key block's tokens
#: (per channel), bytes after each value token's codes (per token); OpenVINO's CPU layout
U8_SCALE_BYTES = 8
#: OPENVINO_CPU_KV_CACHE_PRECISION -> core's kv_cache_dtype ("" = the compute dtype)
_KV_PRECISIONS = {"": None, "f32": "float32", "bf16": "bfloat16", "f16": "float16", "u8": "u8"}
_INFERENCE_PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}


OPENVINO_ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("OPENVINO_DEVICE", str, "CPU", "the OpenVINO device that runs the model", choices=("CPU", "GPU")),
    EnvVar(
        "OPENVINO_KVCACHE_SPACE",
        non_negative(float),
        0.0,
        "KV cache size in GiB; when set it wins over CPU_KVCACHE_SPACE and the engine's kv_cache_bytes",
    ),
    EnvVar(
        "OPENVINO_CPU_KV_CACHE_PRECISION",
        str,
        "",
        "KV cache element type: the compute dtype's (f32, bf16; empty: that one), or u8: one-byte codes with "
        "scales (OpenVINO's own block layout, 1.7x smaller than bf16; the model must run in the OpenVINO graph); "
        "OpenVINO's CPU attention compiles no other (f16, bf16 under f32 compute: refused)",
        choices=tuple(_KV_PRECISIONS),
    ),
    EnvVar(
        "OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE",
        non_negative(int),
        0,
        "OpenVINO's DYNAMIC_QUANTIZATION_GROUP_SIZE: compressed-weight products take int8 activations "
        "quantized in groups of this many (openvino-genai's CPU default is 32); 0: float activations",
    ),
    EnvVar(
        "OPENVINO_Q4_1_INTEGER_ZERO_POINTS",
        bool,
        False,
        "round GGUF Q4_1 zero points (-min/scale) to 4-bit integers as openvino-genai's GGUF reader does: "
        "int8 activations can then run those products, but each weight moves by up to half a step (not the "
        "file's model; 0: f16 zero points, within 2^-11 of a step)",
    ),
    EnvVar(
        "OPENVINO_Q4_1_SPLIT",
        str,
        "auto",
        "GGUF Q4_1 products as d*q (no zero point) plus the blocks' minimums times the activations' block "
        "sums: exact, and int8 activations run the main product; auto: with int8 activations "
        "(OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE > 0) only; 1: always; 0: never (f16 zero points)",
        choices=("auto", "0", "1"),
    ),
    EnvVar(
        "OPENVINO_ENABLE_QUANTIZED_WEIGHTS",
        bool,
        True,
        "keep GGUF Q8_0/Q4_0/Q4_1 weights compressed in the graph (0: dequantize them at load)",
    ),
)


class OpenVinoMemoryProfiler(CpuMemoryProfiler):
    """The CPU family's KV budget, with ``OPENVINO_KVCACHE_SPACE`` first when set (> 0)."""

    space_vars = ("OPENVINO_KVCACHE_SPACE", "CPU_KVCACHE_SPACE")


class OpenVinoPlatform(CpuPlatform):
    """Models run by the OpenVINO runtime (its CPU device), built from core's model description."""

    name = "openvino"
    device_type = "cpu"
    priority = 5
    api_version = 2
    supported_dtypes = ("float32", "bfloat16")
    supported_kv_cache_dtypes = ("bfloat16", "float16")
    env_vars = CPU_ENV_VARS + OPENVINO_ENV_VARS

    @property
    def num_threads(self) -> int:
        """The threads OpenVINO runs: the bound compute CPUs, or every CPU the process may use."""
        return len(self.compute_cpus if self.compute_cpus is not None else process_cpus())

    def unavailable_reason(self) -> str | None:
        try:
            if importlib.util.find_spec("openvino") is None:
                return "openvino is not installed (pip install openvino)"
            device = self.env["OPENVINO_DEVICE"]
        except Exception as exc:  # a bad variable or a broken install: unavailable, never raised
            return f"{type(exc).__name__}: {exc}"
        if device != "CPU":
            return (
                f"OPENVINO_DEVICE={device}: only the CPU device shares core's KV cache memory "
                "(a GPU needs device-owned caches)"
            )
        return None

    def device_info(self) -> dict[str, Any]:
        try:
            ov_version = version("openvino")
        except PackageNotFoundError:
            ov_version = None
        return {"name": f"OpenVINO {ov_version} {self.env['OPENVINO_DEVICE']}", "count": 1,
                "num_threads": self.num_threads}  # fmt: skip

    def check_config(self, config: EngineConfigView) -> dict[str, Any]:
        """Blocks of 32 tokens (OpenVINO's CPU PagedAttention reads no other size: any other
        gives wrong attention silently), the KV cache type from
        ``OPENVINO_CPU_KV_CACHE_PRECISION`` (u8: :meth:`kv_cache_layout`; the engine's
        ``kv_cache_dtype`` stays the compute dtype); LoRA refused (the graph adds no adapters),
        and a cache of neither the compute dtype nor u8 (OpenVINO 2026.4's CPU PagedAttention
        refuses to compile bf16/f16 caches under f32 compute and f16 caches under bf16)."""
        if config.enable_lora:
            raise ValueError("openvino does not serve LoRA adapters (its graph has no adapter products)")
        overrides: dict[str, Any] = {}
        if config.block_size != OPENVINO_BLOCK_SIZE:
            overrides["block_size"] = OPENVINO_BLOCK_SIZE
        precision = self.env["OPENVINO_CPU_KV_CACHE_PRECISION"]
        kv_dtype = _KV_PRECISIONS[precision]
        # the compute dtype as core will resolve it (not yet done when check_config runs)
        compute = self.supported_dtypes[0] if config.dtype == "auto" else DTYPE_ALIASES.get(config.dtype, config.dtype)
        if kv_dtype == "u8":
            overrides["kv_cache_dtype"] = "auto"
        elif kv_dtype == "float32":
            if compute != "float32":
                raise ValueError(f"OPENVINO_CPU_KV_CACHE_PRECISION=f32 needs --dtype float32, not {config.dtype}")
            overrides["kv_cache_dtype"] = "auto"
        elif kv_dtype is not None:
            overrides["kv_cache_dtype"] = kv_dtype
        cache = overrides.get("kv_cache_dtype", config.kv_cache_dtype)
        if cache not in ("auto", compute):
            how = f"OPENVINO_CPU_KV_CACHE_PRECISION={precision}" if kv_dtype else f"kv_cache_dtype={cache}"
            raise ValueError(
                f"{how} under {compute} compute: OpenVINO's CPU PagedAttention takes only a KV cache of the "
                "compute dtype or u8 (OPENVINO_CPU_KV_CACHE_PRECISION=u8)"
            )
        return overrides

    def kv_cache_layout(self, config: EngineConfigView, num_kv_heads: int, head_size: int) -> KVCacheLayout:
        """``OPENVINO_CPU_KV_CACHE_PRECISION=u8``: OpenVINO's CPU layout of u8 blocks, heads first,
        keys quantized per channel (:data:`U8_SCALE_BYTES` rows of scales after a block's tokens),
        values per token (that many bytes after each token's codes), read by the OpenVINO graph
        alone. Otherwise the standard layout: OpenVINO reads the same bytes of each block as
        ``[kv_heads, block_size, head_size]``, and a model it cannot build runs eagerly on them."""
        if self.env["OPENVINO_CPU_KV_CACHE_PRECISION"] != "u8":
            return super().kv_cache_layout(config, num_kv_heads, head_size)
        b, s = config.block_size, head_size
        return KVCacheLayout(
            (num_kv_heads, b + U8_SCALE_BYTES, s), (num_kv_heads, b, s + U8_SCALE_BYTES), torch.uint8,
            "OpenVINO u8 (keys: per-channel scale rows, values: per-token scales)",
        )  # fmt: skip

    def compile_properties(self, dtype: Any, kv_type: str) -> dict[str, Any]:
        """OpenVINO's compile properties for compute dtype ``dtype`` and KV cache element type
        ``kv_type`` (``"f32"``, ``"bf16"``, ``"f16"``, ``"u8"``: OpenVINO would pick u8 when not
        told): the compute precision (no implicit bf16 on CPUs that have it), keys of a u8 cache
        quantized per channel (the layout :meth:`kv_cache_layout` declares), dynamic int8
        quantization of activations only when ``OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE`` asks,
        one stream on the bound threads."""
        name = str(dtype).removeprefix("torch.")
        return {
            "INFERENCE_PRECISION_HINT": _INFERENCE_PRECISIONS.get(name, "f32"),
            "KV_CACHE_PRECISION": kv_type,
            **({"KEY_CACHE_QUANT_MODE": "BY_CHANNEL"} if kv_type == "u8" else {}),
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": self.env["OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE"],
            "NUM_STREAMS": 1,
            "INFERENCE_NUM_THREADS": self.num_threads,
        }

    def q4_1_form(self) -> str:
        """The form of GGUF Q4_1 products in the graph (:data:`plugin_openvino.weights.Q4_1_FORMS`):
        ``round`` under ``OPENVINO_Q4_1_INTEGER_ZERO_POINTS`` (openvino-genai's model, not the
        file's); else ``split`` as ``OPENVINO_Q4_1_SPLIT`` says (``auto``: with int8 activations,
        which OpenVINO runs into its main product and not into one with f16 zero points);
        else ``f16`` zero points (one product).

        :raises ValueError: both rounded zero points and ``OPENVINO_Q4_1_SPLIT=1`` asked for.
        """
        split = self.env["OPENVINO_Q4_1_SPLIT"]
        if self.env["OPENVINO_Q4_1_INTEGER_ZERO_POINTS"]:
            if split == "1":
                raise ValueError("OPENVINO_Q4_1_INTEGER_ZERO_POINTS=1 and OPENVINO_Q4_1_SPLIT=1: choose one Q4_1 form")
            return "round"
        if split == "auto":
            return "split" if self.env["OPENVINO_DYNAMIC_QUANTIZATION_GROUP_SIZE"] else "f16"
        return "split" if split == "1" else "f16"

    def bind_compute_threads(self, cpus: list[int]) -> str:
        super().bind_compute_threads(cpus)
        return f"; OpenVINO runs {len(cpus)} threads"

    def make_kernels(self):
        from plugin_openvino.kernels import OpenVinoKernels

        return OpenVinoKernels(keep_gguf=self.env["OPENVINO_ENABLE_QUANTIZED_WEIGHTS"])

    def make_memory_profiler(self):
        return OpenVinoMemoryProfiler(self)

    def make_runner(self):
        from plugin_openvino.runner import OpenVinoRunner

        return OpenVinoRunner(self)
