"""``make_executor``: the executor an engine's settings ask for."""

from __future__ import annotations

from typing import Any

from plugins import EngineConfigView, Platform

from core.distributed.executor import LocalExecutor
from core.distributed.mp_executor import MultiprocExecutor
from core.distributed.ray_executor import RayExecutor
from core.loader import ModelSource


def make_executor(
    platform: Platform,
    config: EngineConfigView,
    model: ModelSource,
    load_tokenizer: bool,
    draft_model: str | None = None,
) -> Any:
    """The executor ``config`` asks for: in this process for one rank of one replica, else ``mp`` or ``ray``.

    :param draft_model: a speculative draft model to load beside the model (one rank of one replica only).
    :raises ValueError: a draft model with a split or replicated model.
    """
    if config.world_size == 1 and config.data_parallel_size == 1:
        return LocalExecutor(platform, config, model, load_tokenizer, draft_model)
    if draft_model is not None:
        raise ValueError(
            "speculative_config: draft_model runs with tensor_parallel_size=1, pipeline_parallel_size=1 and "
            f"data_parallel_size=1 (got {config.tensor_parallel_size}, {config.pipeline_parallel_size} and "
            f"{config.data_parallel_size})"
        )
    if config.distributed_executor_backend == "ray":
        return RayExecutor(platform, config, load_tokenizer)
    return MultiprocExecutor(platform, config, model, load_tokenizer)
