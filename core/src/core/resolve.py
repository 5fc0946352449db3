"""Settle the engine's configuration once, before the engine is built.

In order: validate the user's settings -> choose the platform -> merge its
``check_config`` overrides -> resolve the dtype and the KV cache dtype -> resolve
``max_model_len`` against the model's own limit -> the scheduler's token budget (the platform's
default unless set). The result is the read-only :class:`plugins.EngineConfigView` every
later step (device set-up, loading, the memory profiler, the runner) receives. Only the KV
plan is left: it needs the loaded weights (:meth:`core.model_runner.ModelRunner.plan_kv_cache`).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from plugins import EngineConfigView, Platform
from plugins.config import DTYPE_ALIASES, KV_CACHE_DTYPE_ALIASES, EngineSettings, declared_settings

from core.config import EngineConfig
from core.discovery import discover, select_platform
from core.loader import ModelSource, open_model

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedEngine:
    """What an engine is built from: the platform, its settled settings and the model to load."""

    platform: Platform
    config: EngineConfigView
    model: ModelSource


def resolve_platform(device: str | Platform | type[Platform]) -> Platform:
    """A platform instance for ``device``: a Platform (used as is), a Platform class, or a name / ``auto``."""
    if isinstance(device, Platform):
        return device
    if isinstance(device, type) and issubclass(device, Platform):
        return device()
    return select_platform(device, discover())


def resolve_engine(config: EngineConfig) -> ResolvedEngine:
    """Validate ``config``, choose its platform and settle every setting the engine needs.

    :raises ValueError: naming the setting that cannot work (also for a platform's overrides).
    :raises plugins.PlatformUnavailable: when the device cannot be used.
    """
    validate_settings(config)
    platform = resolve_platform(config.device)
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    view = EngineConfigView(**{**fields, "device": platform.name})
    view = _merge_overrides(view, platform.check_config(view), f"platform {platform.name}")
    dtype = _resolve_dtype(view.dtype, platform)
    kv_cache_dtype = _resolve_kv_cache_dtype(view.kv_cache_dtype, dtype, platform)
    model = open_model(view.model)
    max_model_len = _resolve_max_model_len(view.max_model_len, model.max_model_len)
    budget = view.max_num_batched_tokens
    if budget is None:
        budget = platform.default_max_num_batched_tokens(view)
        logger.info("platform %s sets max_num_batched_tokens=%d (its default)", platform.name, budget)
    # every running sequence must be able to take one token a step
    budget = max(budget, view.max_num_seqs)
    view = dataclasses.replace(
        view, dtype=dtype, kv_cache_dtype=kv_cache_dtype, max_model_len=max_model_len, max_num_batched_tokens=budget,
        max_cpu_loras=view.max_cpu_loras or view.max_loras,
    )  # fmt: skip
    return ResolvedEngine(platform, view, model)


def validate_settings(settings: EngineConfig | EngineConfigView) -> None:
    """Reject impossible settings (the user's, or after a platform's overrides), naming the field."""
    for field, how in declared_settings(EngineSettings):
        value = getattr(settings, field.name)
        if how.choices is not None and value not in how.choices and not (value is None and field.default is None):
            raise ValueError(f"{field.name} must be one of {', '.join(how.choices)}, got {value!r}")
    positive = ("max_num_seqs", "max_num_batched_tokens", "block_size", "tensor_parallel_size", "pipeline_parallel_size",
                "data_parallel_size", "max_loras", "max_lora_rank")  # fmt: skip
    for name in positive:
        value = getattr(settings, name)
        if value is None and name == "max_num_batched_tokens":
            continue  # the platform's default, settled after check_config
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if settings.max_model_len is not None and settings.max_model_len < 1:
        raise ValueError(f"max_model_len must be positive, got {settings.max_model_len}")
    if not 0 < settings.gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {settings.gpu_memory_utilization}")
    if settings.kv_cache_bytes is not None and settings.kv_cache_bytes <= 0:
        raise ValueError(f"kv_cache_bytes must be positive, got {settings.kv_cache_bytes}")
    if settings.enable_lora and settings.pipeline_parallel_size > 1:
        raise ValueError("enable_lora runs with pipeline_parallel_size=1 (LoRA over pipeline stages is not built yet)")
    if settings.max_cpu_loras is not None and settings.max_cpu_loras < settings.max_loras:
        raise ValueError(f"max_cpu_loras ({settings.max_cpu_loras}) must be >= max_loras ({settings.max_loras})")


def _merge_overrides(view: EngineConfigView, overrides: dict[str, Any], source: str) -> EngineConfigView:
    fields = {f.name for f in dataclasses.fields(view)}
    for key, value in overrides.items():
        if key not in fields:
            raise ValueError(f"{source} overrides unknown engine setting {key!r}")
        if getattr(view, key) != value:
            logger.info("%s sets %s=%r (was %r)", source, key, value, getattr(view, key))
    view = dataclasses.replace(view, **overrides)
    validate_settings(view)
    return view


def _resolve_dtype(dtype: str, platform: Platform) -> str:
    supported = platform.supported_dtypes
    name = supported[0] if dtype == "auto" else DTYPE_ALIASES.get(dtype, dtype)
    if name not in supported:
        raise ValueError(f"dtype {name!r} is not supported on {platform.name}; supported: {', '.join(supported)}")
    return name


def _resolve_kv_cache_dtype(kv_cache_dtype: str, dtype: str, platform: Platform) -> str:
    if kv_cache_dtype == "auto":
        return dtype
    name = KV_CACHE_DTYPE_ALIASES.get(kv_cache_dtype, kv_cache_dtype)
    if name not in platform.supported_kv_cache_dtypes:
        supported = ", ".join(("auto", *platform.supported_kv_cache_dtypes))
        raise ValueError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not supported on {platform.name}; supported: {supported}"
        )
    return name


def _resolve_max_model_len(requested: int | None, limit: int) -> int:
    if requested is None:
        return limit
    if requested > limit:
        raise ValueError(f"max_model_len {requested} exceeds the model's limit of {limit} tokens")
    return requested
