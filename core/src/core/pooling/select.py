"""``--runner auto|generate|pooling``: which engine a checkpoint gets, settled before it is built."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

from core.config import EngineConfig
from core.engine import LLMEngine
from core.loader import resolve_model
from core.models.registry import MODEL_REGISTRY
from core.pooling.engine import PoolingEngine

logger = logging.getLogger(__name__)


def choose_runner(runner: str, model: str | None) -> str:
    """``generate`` or ``pooling`` for ``model``: ``auto`` picks pooling for an encoder (BERT) folder.

    :raises ValueError: ``generate`` asked of an encoder, which cannot generate.
    """
    path = resolve_model(model)
    architectures = []
    if path.is_dir() and (path / "config.json").exists():
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    is_encoder = any(getattr(MODEL_REGISTRY.get(name), "is_pooling_model", False) for name in architectures)
    if runner == "auto":
        chosen = "pooling" if is_encoder else "generate"
        logger.info("runner %s: %s", chosen, f"{architectures[0]} is an encoder" if is_encoder else "a decoder")
        return chosen
    if runner == "generate" and is_encoder:
        raise ValueError(
            f"{architectures[0]} is an encoder: it cannot generate; serve it with --runner pooling (or auto)"
        )
    return runner


def make_engine(config: EngineConfig, skip_tokenizer_init: bool = False, data_parallel_rank: int = 0) -> Any:
    """The engine ``config`` asks for: an :class:`~core.engine.LLMEngine` for the generate runner,
    a :class:`~core.pooling.engine.PoolingEngine` for the pooling runner (``config.runner`` settled)."""
    runner = choose_runner(config.runner, config.model)
    config = dataclasses.replace(config, runner=runner)
    engine_class = PoolingEngine if runner == "pooling" else LLMEngine
    return engine_class(config, skip_tokenizer_init=skip_tokenizer_init, data_parallel_rank=data_parallel_rank)
