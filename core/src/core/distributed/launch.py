"""``make_executor``: the executor an engine's settings ask for."""

from __future__ import annotations

from typing import Any

from plugins import EngineConfigView, Platform

from core.distributed.executor import LocalExecutor
from core.distributed.mp_executor import MultiprocExecutor
from core.distributed.ray_executor import RayExecutor
from core.loader import ModelSource


def make_executor(platform: Platform, config: EngineConfigView, model: ModelSource, load_tokenizer: bool) -> Any:
    """The executor ``config`` asks for: in this process for one rank of one replica, else ``mp`` or ``ray``."""
    if config.tensor_parallel_size == 1 and config.data_parallel_size == 1:
        return LocalExecutor(platform, config, model, load_tokenizer)
    if config.distributed_executor_backend == "ray":
        return RayExecutor(platform, config, load_tokenizer)
    return MultiprocExecutor(platform, config, load_tokenizer)
