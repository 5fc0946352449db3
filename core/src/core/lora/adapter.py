"""LoRA adapters as peft saves them, read and checked; what we cannot apply is refused by name.

A peft LoRA directory holds ``adapter_config.json`` and ``adapter_model.safetensors`` (or
``adapter_model.bin``) with, per adapted module, ``...layers.{i}.self_attn.q_proj.lora_A.weight``
``[r, in]`` and ``...lora_B.weight`` ``[out, r]``. The delta of a module is
``scaling * B @ A @ x`` with ``scaling = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
``use_rslora``); :func:`load_adapter` folds it into ``B``.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.lora.request import LoRARequest
from core.lora.stacks import MODULE_PARTS

#: the projections an adapter may adapt (Hugging Face names of the Llama family)
TARGET_MODULES = tuple(MODULE_PARTS)
_KEY = re.compile(
    r"(?:base_model\.model\.)?(?:model\.)?layers\.(\d+)\.(?:self_attn|mlp)\.(\w+?)\.lora_([AB])(?:\.\w+)?\.weight"
)
# config fields whose non-default values change what the adapter computes, and what they mean
_REFUSED = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "modules_to_save (fully trained copies of modules)",
    "lora_bias": "LoRA biases (lora_bias)",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D weights)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
}


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter's weights, float32 on the host.

    :ivar weights: ``(layer, module) -> (A [r, in], B [out, r])`` with the scaling folded into
        ``B``; ``module`` one of :data:`TARGET_MODULES`.
    """

    request: LoRARequest
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def read_config(request: LoRARequest, max_rank: int) -> tuple[int, float]:
    """The adapter's rank and scaling, from its ``adapter_config.json``.

    :raises ValueError: no such directory or config, not a LoRA, a rank above ``max_rank``,
        or a feature we cannot apply (DoRA, ``modules_to_save``, biases, ...), named.
    """
    where = f"LoRA adapter {request.lora_name!r} ({request.lora_path})"
    path = Path(request.lora_path) / "adapter_config.json"
    if not path.is_file():
        raise ValueError(f"{where}: no adapter_config.json there")
    try:
        config: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{where}: unreadable adapter_config.json: {exc}") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {config['peft_type']!r}, only LORA adapters are supported")
    refused = [what for key, what in _REFUSED.items() if config.get(key)]
    if config.get("bias", "none") != "none":
        refused.append(f"bias={config['bias']!r} (trained biases)")
    if refused:
        raise ValueError(f"{where} uses {', '.join(refused)}: not supported")
    rank, alpha = config.get("r"), config.get("lora_alpha", config.get("r"))
    if not isinstance(rank, int) or rank < 1:
        raise ValueError(f"{where}: r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"{where}: its rank {rank} is above the maximum LoRA rank {max_rank} (--max-lora-rank)")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)


def _read_tensors(directory: Path, where: str) -> dict[str, torch.Tensor]:
    safetensors, pickled = directory / "adapter_model.safetensors", directory / "adapter_model.bin"
    if safetensors.is_file():
        from safetensors.torch import load_file

        return load_file(str(safetensors))
    if pickled.is_file():
        return torch.load(pickled, map_location="cpu", weights_only=True)
    raise ValueError(f"{where}: neither adapter_model.safetensors nor adapter_model.bin there")


def load_adapter(request: LoRARequest, max_rank: int) -> LoRAAdapter:
    """Read and check an adapter (:func:`read_config`, then its weights).

    :raises ValueError: as :func:`read_config`, or a weight that is not a LoRA A/B of a
        target module (embeddings, ``lm_head``, ...), or an A without its B.
    """
    rank, scaling = read_config(request, max_rank)
    where = f"LoRA adapter {request.lora_name!r} ({request.lora_path})"
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in _read_tensors(Path(request.lora_path), where).items():
        match = _KEY.fullmatch(name)
        if match is None or match[2] not in TARGET_MODULES:
            kind = "DoRA magnitudes" if "lora_magnitude" in name else f"weight {name!r}"
            raise ValueError(f"{where}: cannot apply {kind}; adapted modules must be among {', '.join(TARGET_MODULES)}")
        parts.setdefault((int(match[1]), match[2]), {})[match[3]] = tensor
    weights = {}
    for key, ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{where}: layer {key[0]} {key[1]} has lora_{next(iter(ab))} without its pair")
        a, b = ab["A"].float(), ab["B"].float() * scaling
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != rank or b.shape[1] != rank:
            raise ValueError(
                f"{where}: layer {key[0]} {key[1]} has A {tuple(a.shape)} and B {tuple(b.shape)}, not rank {rank}"
            )
        weights[key] = (a.contiguous(), b.contiguous())
    if not weights:
        raise ValueError(f"{where}: no LoRA weights in it")
    return LoRAAdapter(request, rank, weights)
