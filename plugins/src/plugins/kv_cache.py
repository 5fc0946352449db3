"""KV cache dtypes: 16-bit caches under float32 compute, one-byte FP8 caches and their
per-layer scales (the torch reference); and the layout a platform declares for its caches
(:class:`KVCacheLayout`).

``--kv-cache-dtype`` takes vLLM's values: ``auto`` (the compute dtype), ``bfloat16``,
``float16``, ``fp8`` (= ``fp8_e4m3``), ``fp8_e4m3`` and ``fp8_e5m2``. A platform lists the dtypes
its kernels store and read besides the compute dtype in
:attr:`plugins.Platform.supported_kv_cache_dtypes`.

- ``float16`` and ``bfloat16`` under float32 compute halve the bytes a decode step reads from
  the cache (each cached row is read once a step) and double the tokens a cache holds; values
  are rounded to nearest even, read back widened to float32. ``float16`` keeps 11 significant
  bits (a value past 65504 becomes inf, as torch casts), ``bfloat16`` 8 with float32's range.

- ``fp8_e5m2`` (``torch.float8_e5m2``) is the top byte of an IEEE fp16: its range covers
  any activation, so it is stored without a scale (values cast with round-to-nearest-even).
- ``fp8_e4m3`` (``torch.float8_e4m3fn``) has one more mantissa bit but a range of only
  +-448 and loses precision below 2**-6; each layer stores ``x / scale`` with a
  ``kv_scale`` tensor ``float32 [2]`` = (K scale, V scale). A scale of 0 means "not set
  yet": the first write to the layer's cache sets it to ``amax(|x|) / E4M3_CALIBRATION_TARGET``
  of the tokens written (the prompt), leaving headroom for later, larger values, which
  saturate at +-448 instead of overflowing. vLLM computes its dynamic scales the same way
  (``amax / 200``); its default of 1.0 puts small models' values near the subnormals.

A layer's KV cache is the pair ``(k_cache, v_cache)``, or ``(k_cache, v_cache, kv_scale)``
for ``fp8_e4m3`` (see :mod:`plugins.attention`), each tensor shaped as the platform's
:class:`KVCacheLayout` says (:meth:`plugins.Platform.kv_cache_layout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: the one-byte KV dtypes by resolved name
FP8_KV_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
#: the dtypes a platform may declare in ``supported_kv_cache_dtypes``, by resolved name
DECLARABLE_KV_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, **FP8_KV_DTYPES}
#: the first write maps ``amax(|x|)`` to this value (E4M3's largest is 448): 2x headroom
E4M3_CALIBRATION_TARGET = 224.0


def kv_torch_dtype(name: str) -> torch.dtype:
    """The ``torch.dtype`` of a resolved KV cache dtype name (``"fp8_e4m3"``, ``"bfloat16"``, ...).

    :raises ValueError: for an unknown name (or the unresolved ``"auto"``/``"fp8"``).
    """
    if name in DECLARABLE_KV_DTYPES:
        return DECLARABLE_KV_DTYPES[name]
    if name == "float32":
        return torch.float32
    raise ValueError(
        f"unknown resolved KV cache dtype {name!r}; expected bfloat16, float16, fp8_e4m3, fp8_e5m2 or a compute dtype"
    )


def needs_scale(cache_dtype: torch.dtype) -> bool:
    """Whether a cache of ``cache_dtype`` stores scaled values (E4M3) and so needs a ``kv_scale``."""
    return cache_dtype == torch.float8_e4m3fn


def new_kv_scale(device: torch.device | str) -> torch.Tensor:
    """A layer's ``kv_scale``: ``float32 [2]`` (K, V), zero = set by the first write."""
    return torch.zeros(2, dtype=torch.float32, device=device)


def calibrate(kv_scale: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Set the scales still at 0 from the values about to be written (in place, no host sync).

    :param kv_scale: ``float32 [2]``; an entry already positive is kept.
    :param k: the keys being written (any shape, at least one element); likewise ``v``.
    """
    amax = torch.stack((k.abs().amax(), v.abs().amax())).float()
    # an all-zero first write says nothing about the range: 1.0, vLLM's default
    fresh = torch.where(amax > 0, amax / E4M3_CALIBRATION_TARGET, torch.ones_like(amax))
    kv_scale.copy_(torch.where(kv_scale > 0, kv_scale, fresh))


def quantize(x: torch.Tensor, cache_dtype: torch.dtype, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` (divided by ``scale`` when given) in ``cache_dtype``.

    FP8 values saturate at the format's largest value: a plain cast would turn an E4M3
    overflow into NaN and an E5M2 overflow into inf.
    """
    if cache_dtype not in FP8_KV_DTYPES.values():
        return x.to(cache_dtype)
    xf = x.float() if scale is None else x.float() / scale
    limit = torch.finfo(cache_dtype).max
    return xf.clamp(-limit, limit).to(cache_dtype)


def as_bytes(x: torch.Tensor) -> torch.Tensor:
    """An FP8 tensor viewed as ``uint8`` (the same bytes; other dtypes as they are): gathers
    and scatters run on uint8 on every device, not all devices have them for float8."""
    return x.view(torch.uint8) if x.dtype in FP8_KV_DTYPES.values() else x


def dequantize(x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Cached values as float32 (times ``scale`` when given)."""
    return x.float() if scale is None else x.float() * scale


@dataclass(frozen=True)
class KVCacheLayout:
    """How a platform lays out one layer's KV cache (:meth:`plugins.Platform.kv_cache_layout`):
    a key tensor ``[num_blocks, *key_block]`` and a value tensor ``[num_blocks, *value_block]``,
    both of ``dtype``; core allocates them (``MemoryProfiler.allocate_kv_cache``), counts
    :attr:`block_bytes` against the KV budget and indexes them by block id only.

    :meth:`standard` is the layout the SDK's kernels (``write_kv_cache``, ``paged_attention``) and
    every model's eager forward read: ``[block_size, kv_heads, head_size]`` of the resolved KV cache
    dtype. A platform whose own runner reads something else (one-byte codes with scale rows, heads
    first) declares it; caches of such a layout are read by that runner alone.

    :ivar description: what the layout is, for the log (empty for the standard one).
    """

    key_block: tuple[int, ...]
    value_block: tuple[int, ...]
    dtype: torch.dtype
    description: str = ""

    def __post_init__(self) -> None:
        for name in ("key_block", "value_block"):
            dims = getattr(self, name)
            if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
                raise ValueError(f"KVCacheLayout.{name} must be positive ints, got {dims!r}")

    @classmethod
    def standard(cls, block_size: int, num_kv_heads: int, head_size: int, dtype: torch.dtype) -> KVCacheLayout:
        """``[block_size, num_kv_heads, head_size]`` of ``dtype`` for keys and values alike."""
        block = (block_size, num_kv_heads, head_size)
        return cls(block, block, dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes one block takes in one layer, keys and values together."""
        return (math.prod(self.key_block) + math.prod(self.value_block)) * self.dtype.itemsize

    def shapes(self, num_blocks: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The key and value tensors' shapes for ``num_blocks`` blocks."""
        return (num_blocks, *self.key_block), (num_blocks, *self.value_block)
