"""How a checkpoint pools: sentence-transformers' configuration, or the decoder default.

A sentence-transformers folder names its modules in ``modules.json``: the transformer, a
``Pooling`` module whose ``config.json`` sets the mode (mean, CLS, last token), and optionally
``Normalize``; ``sentence_bert_config.json`` sets ``max_seq_length``. A folder without them
pools as vLLM does by default: an encoder its [CLS] row, a decoder its last token, normalized.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

POOLING_TYPES = ("mean", "cls", "last")
_MODES = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}


@dataclass(frozen=True)
class PoolerConfig:
    """The model's pooling: ``pooling_type`` (mean, cls or last), whether vectors are L2-normalized
    by default, the longest input (None: the model's own limit), and the sizes a Matryoshka model
    may be cut to (None: it may not)."""

    pooling_type: str
    normalize: bool
    max_seq_length: int | None = None
    matryoshka_dimensions: tuple[int, ...] | None = None


def read_pooler_config(path: Path, hf_config: Any, is_encoder: bool) -> PoolerConfig:
    """The pooler configuration of the model at ``path`` (a folder or a file).

    :raises ValueError: for a pooling module this engine does not run (max, mean-sqrt-len, weighted).
    """
    matryoshka = _matryoshka(hf_config)
    modules_file = path / "modules.json" if path.is_dir() else None
    if modules_file is None or not modules_file.exists():
        pooling = "cls" if is_encoder else "last"
        logger.info("no sentence-transformers modules.json: %s pooling, normalized", pooling)
        return PoolerConfig(pooling, True, None, matryoshka)
    modules = json.loads(modules_file.read_text())
    kinds = {m["type"].rsplit(".", 1)[-1]: m for m in modules}
    unknown = sorted(set(kinds) - {"Transformer", "Pooling", "Normalize"})
    if unknown:
        raise ValueError(f"{modules_file} has modules this engine does not run: {', '.join(unknown)}")
    pooling = "cls" if is_encoder else "last"
    if "Pooling" in kinds:
        settings = json.loads((path / kinds["Pooling"]["path"] / "config.json").read_text())
        chosen = [mode for key, mode in _MODES.items() if settings.get(key)]
        others = [k for k, v in settings.items() if k.startswith("pooling_mode") and v and k not in _MODES]
        if others or len(chosen) != 1:
            raise ValueError(
                f"unsupported sentence-transformers pooling {others or chosen}: one of mean, cls, lasttoken"
            )
        pooling = chosen[0]
    max_len = None
    bert_config = path / "sentence_bert_config.json"
    if bert_config.exists():
        max_len = json.loads(bert_config.read_text()).get("max_seq_length")
    return PoolerConfig(pooling, "Normalize" in kinds, max_len, matryoshka)


def _matryoshka(hf_config: Any) -> tuple[int, ...] | None:
    """The dimensions a Matryoshka model declares (vLLM's ``matryoshka_dimensions`` /
    ``is_matryoshka`` in config.json): None when it declares none."""
    dims = getattr(hf_config, "matryoshka_dimensions", None)
    if dims:
        return tuple(int(d) for d in dims)
    if getattr(hf_config, "is_matryoshka", False):
        return tuple(range(1, hf_config.hidden_size + 1))
    return None
