"""A GGUF file's metadata and tensor directory, read once with ``gguf.GGUFReader`` and cached.

``GGUFReader`` parses every vocabulary string in Python (seconds for a 49k vocab), so
the scalar metadata and the tensor offsets are kept as JSON under the cache directory,
keyed by the file's path, size and mtime; a second start maps the file directly.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from plugins.byteorder import to_host_order
from plugins.gguf_quants import FORMATS, dequantize

from core.loader.cache import cache_root, file_key

logger = logging.getLogger(__name__)

# Large arrays that only the tokenizer conversion needs (it reads the file itself).
_SKIPPED_FIELDS = (
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.scores",
)
_INDEX_VERSION = 1


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in the file. ``shape`` is in torch order (outermost first)."""

    qtype: str
    shape: tuple[int, ...]
    offset: int
    num_bytes: int

    @property
    def is_quantized(self) -> bool:
        return self.qtype not in ("F32", "F16", "BF16")


class GGUFIndex:
    """Metadata and tensors of one GGUF file; tensors are read through a memory map."""

    def __init__(self, path: Path, metadata: dict[str, Any], tensors: dict[str, TensorInfo]) -> None:
        self.path = path
        self.metadata = metadata
        self.tensors = tensors
        self._data = np.memmap(path, dtype=np.uint8, mode="r")

    @classmethod
    def open(cls, path: Path) -> GGUFIndex:
        """Read the index from the cache, or parse the file and cache it."""
        cached = cache_root() / "gguf" / f"{file_key(path)}.json"
        try:
            raw = json.loads(cached.read_text())
            if raw.get("version") == _INDEX_VERSION:
                tensors = {k: TensorInfo(v[0], tuple(v[1]), v[2], v[3]) for k, v in raw["tensors"].items()}
                return cls(path, raw["metadata"], tensors)
        except (OSError, ValueError, KeyError, IndexError):
            pass  # no usable cache entry: parse the file
        index = cls._parse(path)
        index._save(cached)
        return index

    @classmethod
    def _parse(cls, path: Path) -> GGUFIndex:
        logger.info("reading GGUF metadata of %s", path)
        reader = gguf.GGUFReader(path)
        metadata = {
            name: field.contents()
            for name, field in reader.fields.items()
            if not name.startswith("GGUF.") and name not in _SKIPPED_FIELDS
        }
        metadata["tokenizer.ggml.num_tokens"] = (
            len(reader.fields["tokenizer.ggml.tokens"].data) if ("tokenizer.ggml.tokens" in reader.fields) else None
        )
        tensors = {
            t.name: TensorInfo(
                qtype=t.tensor_type.name,
                shape=tuple(int(n) for n in reversed(t.shape.tolist())),
                offset=int(t.data_offset),
                num_bytes=int(t.n_bytes),
            )
            for t in reader.tensors
        }
        return cls(path, metadata, tensors)

    def _save(self, target: Path) -> None:
        payload = {
            "version": _INDEX_VERSION,
            "metadata": self.metadata,
            "tensors": {k: [t.qtype, list(t.shape), t.offset, t.num_bytes] for k, t in self.tensors.items()},
        }
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(payload, f)
            os.replace(tmp, target)
        except OSError as err:  # a read-only cache only costs speed
            logger.warning("could not cache the GGUF index at %s: %s", target, err)

    def raw(
        self, name: str, rows: slice = slice(None), byte_cols: slice = slice(None), byte_order: str = "little"
    ) -> torch.Tensor:
        """The tensor's bytes as uint8 ``[rows, row_bytes]`` (a copy, safe to move to a device),
        with its numbers in ``byte_order`` (the platform's, :attr:`plugins.Platform.byte_order`;
        the file's are little-endian).

        ``rows`` (a slice or an array of row numbers) and ``byte_cols`` select a window (whole
        blocks or elements); only that window is read from the file.
        """
        info = self.tensors[name]
        num_rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        stored = self._data[info.offset : info.offset + info.num_bytes].reshape(num_rows, -1)
        return to_host_order(torch.from_numpy(np.array(stored[rows, byte_cols])), info.qtype, byte_order)

    def dequantized(
        self, name: str, rows: slice = slice(None), byte_cols: slice = slice(None), byte_order: str = "little"
    ) -> torch.Tensor:
        """The tensor (or the :meth:`raw` window of it) as float32, shaped ``[rows, cols]``
        (1-D tensors stay 1-D), read on a host of ``byte_order``."""
        info = self.tensors[name]
        raw = self.raw(name, rows, byte_cols, byte_order)
        if info.qtype == "BF16":
            values = raw.view(torch.bfloat16).float()
        elif info.qtype in FORMATS:  # the SDK's torch dequantization (bit-exact with gguf.quants, faster)
            block, size, _ = FORMATS[info.qtype]
            values = dequantize(info.qtype, raw, raw.shape[0], raw.shape[-1] // size * block)
        else:
            values = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[info.qtype]))
        if len(info.shape) == 3:  # a stack of experts' matrices (of a window of their rows or columns)
            return values.reshape(info.shape[0], raw.shape[0] // info.shape[0], -1).float()
        shape = (-1,) if len(info.shape) == 1 else (raw.shape[0], -1) if len(info.shape) == 2 else info.shape
        return values.reshape(shape).float()
