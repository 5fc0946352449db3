"""``load_model``: from a model argument to a ready model, tokenizer and limits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from plugins.errors import UnsupportedFeature
from plugins.kernels import Kernels
from transformers import PreTrainedTokenizerBase

from core.loader.gguf_index import GGUFIndex
from core.loader.gguf_model import gguf_config, gguf_tokenizer, gguf_weights
from core.loader.hf_dir import hf_config, hf_generation_config, hf_tokenizer, hf_weights, weight_files
from core.loader.quantized import checkpoint_quantization, gather_quantized, is_quantized_part
from core.loader.source import DEFAULT_MODEL_NAME, resolve_model
from core.models import build_model, get_model_class
from core.partition.pipeline import PipelineStage

logger = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model with weights in place, plus what the engine needs to know about it."""

    model: torch.nn.Module
    hf_config: Any
    tokenizer: PreTrainedTokenizerBase | None  # None with skip_tokenizer_init
    eos_token_ids: list[int]
    generation_config: dict[str, Any]
    name: str
    num_layers: int
    num_kv_heads: int
    head_size: int
    max_model_len: int
    weights_bytes: int
    #: each layer's attention window (None: the whole context)
    layer_windows: list[int | None]
    load_seconds: float = field(default=0.0, compare=False)

    @property
    def kv_window(self) -> int | None:
        """The attention window every layer keeps within (the widest, if they differ), or None
        when some layer attends to the whole context: then no KV block is ever outside them all."""
        windows = self.layer_windows
        return None if not windows or None in windows else max(windows)


@dataclass(frozen=True)
class ModelSource:
    """A model argument resolved to its file or directory and config, before any weight is read."""

    name: str
    path: Path
    hf_config: Any
    max_model_len: int  # the model's own limit (capped at a sliding window)
    gguf: GGUFIndex | None = None  # the index of a .gguf file


def open_model(model: str | None) -> ModelSource:
    """Resolve ``model`` (a HF directory, ``.gguf`` file, hub id or ``None`` for the default model)
    and read its config: enough to settle the engine's settings before loading weights.

    :raises ValueError: for an unknown source or architecture.
    """
    path = resolve_model(model)
    index = None
    if path.is_file() and path.suffix == ".gguf":
        index = GGUFIndex.open(path)
        config = gguf_config(index)
    elif path.is_dir():
        config = hf_config(path)
        get_model_class(getattr(config, "architectures", None))  # fail on the architecture before reading weights
    else:
        raise ValueError(f"model {str(path)!r} is neither a .gguf file nor a Hugging Face model directory")
    name = model if model is not None else DEFAULT_MODEL_NAME
    return ModelSource(name, path, config, _max_model_len(config), index)


def load_model(
    model: str | ModelSource | None,
    *,
    kernels: Kernels,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None = None,
    skip_tokenizer_init: bool = False,
    comm: Any | None = None,
    byte_order: str = "little",
    stage: PipelineStage | None = None,
) -> LoadedModel:
    """Load a model: a :class:`ModelSource` from :func:`open_model`, or what it takes.

    :param quantization: ``None`` (full precision, GGUF weights kept quantized when the
        kernels support ``"gguf"``, or a Hugging Face checkpoint's own ``quantization_config``),
        ``"int8"``, ``"gguf"`` (a GGUF file only), or ``"compressed-tensors"``/``"gptq"``/``"awq"``
        (must match the checkpoint's).
    :param skip_tokenizer_init: load no tokenizer (prompts come as token ids).
    :param comm: a tensor-parallel rank's communicator: load only this rank's shard.
    :param stage: a pipeline stage: load (and read) only its layers (``num_layers`` is then its count).
    :param byte_order: the platform's (:attr:`plugins.Platform.byte_order`): GGUF tensors are
        converted to it; safetensors' reader converts to the host's order itself.
    :raises ValueError: for an unknown source, architecture or an inconsistent checkpoint;
        :class:`plugins.UnsupportedFeature` when the kernels cannot take ``quantization``.
    """
    start = time.perf_counter()
    source = model if isinstance(model, ModelSource) else open_model(model)
    device = torch.device(device)
    if source.gguf is not None:
        loaded = _load_gguf(source, kernels, dtype, device, quantization, skip_tokenizer_init, comm, byte_order, stage)
    else:
        loaded = _load_hf_dir(source, kernels, dtype, device, quantization, skip_tokenizer_init, comm, stage)
    loaded.load_seconds = time.perf_counter() - start
    logger.info(
        "loaded %s (%s, %.1f MB of weights) in %.2f s",
        loaded.name,
        type(loaded.model).__name__,
        loaded.weights_bytes / 2**20,
        loaded.load_seconds,
    )
    return loaded


def _load_hf_dir(
    source: ModelSource,
    kernels: Kernels,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None,
    skip_tokenizer: bool,
    comm: Any | None,
    stage: PipelineStage | None,
) -> LoadedModel:
    path, config = source.path, source.hf_config
    if quantization == "gguf":
        raise ValueError(f"quantization 'gguf' needs a .gguf file; {path} is a Hugging Face directory")
    scheme = checkpoint_quantization(config, quantization)
    if scheme is not None and scheme.method not in kernels.supported_quantizations:
        raise UnsupportedFeature(
            f"the kernels cannot run {scheme.method} checkpoints; they take: "
            f"{', '.join(sorted(kernels.supported_quantizations)) or 'full precision only'}"
        )
    tokenizer = None if skip_tokenizer else hf_tokenizer(path)
    model = build_model(config, kernels, dtype, device, comm, stage)
    held = None if stage is None else model.holds_weight
    if scheme is None:
        weights = hf_weights(weight_files(path), dtype, device, model.tp.plan, held=held)
    else:
        if model.tp.plan.is_sharded:
            raise UnsupportedFeature(f"{scheme.describe()} checkpoints cannot be split over tensor-parallel ranks yet")
        logger.info("%s: %s linears kept as stored", path.name, scheme.describe())
        stored = hf_weights(weight_files(path), dtype, device, model.tp.plan, is_quantized_part, held)
        weights, quantization = gather_quantized(stored, scheme, device), scheme.method
    with torch.no_grad():
        model.load_weights(weights, quantization)
    return _finish(source, model, tokenizer, hf_generation_config(path))


def _load_gguf(
    source: ModelSource,
    kernels: Kernels,
    dtype: torch.dtype,
    device: torch.device,
    quantization: str | None,
    skip_tokenizer: bool,
    comm: Any | None,
    byte_order: str,
    stage: PipelineStage | None,
) -> LoadedModel:
    path, config, index = source.path, source.hf_config, source.gguf
    keep_gguf = quantization == "gguf" or (quantization is None and "gguf" in kernels.supported_quantizations)
    if quantization is None and not keep_gguf:
        logger.info(
            "kernels take no GGUF weights (their supported_quantizations has no 'gguf'): dequantizing %s to %s",
            path.name,
            dtype,
        )
    tokenizer = None if skip_tokenizer else gguf_tokenizer(path, index.metadata.get("tokenizer.chat_template"))
    model = build_model(config, kernels, dtype, device, comm, stage)
    held = None if stage is None else model.holds_weight
    weights = gguf_weights(index, config, keep_gguf, dtype, device, model.tp.plan, byte_order, held)
    with torch.no_grad():
        model.load_weights(weights, "gguf" if keep_gguf else quantization)
    generation = {
        k: v for k, v in (("bos_token_id", config.bos_token_id), ("eos_token_id", config.eos_token_id)) if v is not None
    }
    return _finish(source, model, tokenizer, generation)


def _finish(
    source: ModelSource, model: Any, tokenizer: PreTrainedTokenizerBase | None, generation: dict[str, Any]
) -> LoadedModel:
    config = source.hf_config
    eos: list[int] = []
    for found in (
        generation.get("eos_token_id"),
        getattr(config, "eos_token_id", None),
        tokenizer and tokenizer.eos_token_id,
    ):
        for token in found if isinstance(found, list) else [found]:
            if token is not None and token not in eos:
                eos.append(int(token))
    if tokenizer is not None:  # the architecture's chat format where the checkpoint brings none
        if not tokenizer.chat_template and model.default_chat_template:
            tokenizer.chat_template = model.default_chat_template
        for text in model.end_of_turn_tokens:
            token = tokenizer.convert_tokens_to_ids(text)
            if isinstance(token, int) and token != tokenizer.unk_token_id and token not in eos:
                eos.append(token)
    return LoadedModel(
        model=model,
        hf_config=config,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        generation_config=generation,
        name=source.name,
        num_layers=model.num_layers,
        num_kv_heads=model.num_kv_heads,
        head_size=model.head_size,
        max_model_len=source.max_model_len,
        weights_bytes=model.weights_bytes(),
        layer_windows=model.layer_windows(config),
    )


def _max_model_len(config: Any) -> int:
    """``max_position_embeddings``, capped at the sliding window where one applies and the
    model class attends to the whole context instead (models with per-layer windows do not)."""
    limit = config.max_position_embeddings
    window = getattr(config, "sliding_window", None)
    layer_windows = get_model_class(getattr(config, "architectures", None)).layer_windows(config)
    windowed = any(w is not None for w in layer_windows)
    if window and getattr(config, "use_sliding_window", True) and window < limit and not windowed:
        logger.info("capping max_model_len at the sliding window %d (was %d)", window, limit)
        limit = window
    return limit
