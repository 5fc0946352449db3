"""Weights, config and tokenizer of a Hugging Face model directory (safetensors, sharded or not)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase

from core.partition.sharding import ShardPlan, slice_dense

logger = logging.getLogger(__name__)


def weight_files(directory: Path) -> list[Path]:
    """The checkpoint files: the shards a ``*.index.json`` names, else ``model.safetensors``, else ``*.bin``."""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.exists():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            missing = [s for s in shards if not (directory / s).exists()]
            if missing:
                raise ValueError(f"{index} names shards that are missing: {', '.join(missing)}")
            return [directory / s for s in shards]
    for pattern in ("model.safetensors", "*.safetensors", "pytorch_model.bin"):
        found = sorted(directory.glob(pattern))
        # Mistral repos also ship consolidated.safetensors, the same weights under other names
        found = [f for f in found if not f.name.startswith("consolidated")]
        if found:
            return found
    raise ValueError(f"no model weights (*.safetensors or pytorch_model.bin) in {directory}")


def hf_weights(
    files: list[Path],
    dtype: torch.dtype,
    device: torch.device,
    plan: ShardPlan | None = None,
    keep_stored: Callable[[str, torch.dtype], bool] | None = None,
    held: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` for every tensor of the checkpoint, in ``dtype`` on ``device``.

    With a tensor-parallel ``plan`` only this rank's slice of each tensor is read. Tensors
    for which ``keep_stored(name, stored dtype)`` is true (quantized linears' parts) come
    as stored, on the CPU. With ``held``, only the tensors it is true of are read (a
    pipeline stage's).
    """
    with tqdm(desc="Loading weights", unit="tensor", total=None) as bar:
        for file in files:
            if file.suffix == ".safetensors":
                with safe_open(file, framework="pt", device="cpu") as f:
                    bar.total = (bar.total or 0) + len(f.keys())
                    for name in f.keys():
                        bar.update()
                        if held is not None and not held(name):
                            continue
                        part = plan.slice_for(name) if plan is not None else None
                        tensor = slice_dense(f.get_slice(name), part)
                        yield name, tensor if _stored(keep_stored, name, tensor) else tensor.to(device, dtype)
            else:
                state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
                bar.total = (bar.total or 0) + len(state)
                for name, tensor in state.items():
                    bar.update()
                    if held is not None and not held(name):
                        continue
                    part = plan.slice_for(name) if plan is not None else None
                    tensor = slice_dense(tensor, part)
                    yield name, tensor if _stored(keep_stored, name, tensor) else tensor.to(device, dtype)


def _stored(keep_stored: Callable[[str, torch.dtype], bool] | None, name: str, tensor: torch.Tensor) -> bool:
    return keep_stored is not None and keep_stored(name, tensor.dtype)


def hf_config(directory: Path) -> Any:
    """The transformers config of the directory."""
    return AutoConfig.from_pretrained(directory)


def hf_tokenizer(directory: Path) -> PreTrainedTokenizerBase:
    """The directory's tokenizer (with its chat template when it ships one)."""
    return AutoTokenizer.from_pretrained(directory)


def hf_generation_config(directory: Path) -> dict[str, Any]:
    """``generation_config.json`` as a dict, empty when absent."""
    path = directory / "generation_config.json"
    return json.loads(path.read_text()) if path.exists() else {}
