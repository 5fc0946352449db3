"""The engine's settings as plugins see them: one frozen, typed view.

Core builds an :class:`EngineConfigView` once, before the engine exists, in stages:

1. the user's settings, validated (``dtype`` may still be ``"auto"`` and
   ``max_model_len`` may be ``None``): this is what ``Platform.check_config``
   receives; it returns overrides ``{field: value}`` that core merges with
   :func:`dataclasses.replace`;
2. core then resolves ``dtype``, ``max_model_len`` and the scheduler budget
   (``max_num_batched_tokens``, the platform's default when the user set none); every
   later call (``init_device``, the memory profiler, ``Runner.prepare``) receives the
   fully resolved view: no ``"auto"``, no ``None`` ``max_model_len``.

Plugins read fields as attributes; the view never changes after it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


#: the values ``--kv-cache-dtype`` accepts (vLLM's; :mod:`plugins.kv_cache`), named here
#: without torch so that the CLI imports none
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: ``fp8`` is E4M3, as in vLLM
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}


@dataclass(frozen=True)
class EngineConfigView:
    """The engine's settings (field names follow vLLM's engine arguments).

    :ivar model: HF directory, ``.gguf`` file or hub id; ``None`` = the default model.
    :ivar device: the chosen platform's name (``"auto"`` only before selection).
    :ivar dtype: compute dtype name; ``"auto"`` until resolved.
    :ivar quantization: ``None``, ``"int8"`` (weight-only) or ``"gguf"``.
    :ivar max_model_len: longest sequence (prompt + output) in tokens; ``None`` until resolved.
    :ivar max_num_batched_tokens: most new tokens per engine step; ``None`` until resolved
        (then the user's value, or :meth:`plugins.Platform.default_max_num_batched_tokens`).
    :ivar kv_cache_bytes: KV cache size the user asked for; ``None`` = the platform decides.
    :ivar kv_cache_dtype: ``--kv-cache-dtype`` (:mod:`plugins.kv_cache`): before resolution one of
        ``auto``, ``bfloat16``, ``float16``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``; resolved, one of
        those but ``auto`` and ``fp8``, or the compute dtype's name (for ``auto``).
    :ivar rank: this process's rank among ``world_size`` tensor-parallel workers.
    :ivar local_rank: this process's rank on its own machine.
    """

    model: str | None
    device: str
    dtype: str
    quantization: str | None
    max_model_len: int | None
    max_num_seqs: int
    max_num_batched_tokens: int | None
    block_size: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    seed: int
    enforce_eager: bool
    kv_cache_bytes: int | None
    gpu_memory_utilization: float
    served_model_name: str | None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    distributed_executor_backend: str = "mp"
    rank: int = 0
    local_rank: int = 0
    kv_cache_dtype: str = "auto"

    @property
    def world_size(self) -> int:
        """Number of workers one model is split over (the tensor-parallel size)."""
        return self.tensor_parallel_size

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The resolved KV cache dtype as a ``torch.dtype``.

        :raises ValueError: before resolution (``auto``, ``fp8``).
        """
        from plugins.kv_cache import kv_torch_dtype

        return kv_torch_dtype(self.kv_cache_dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The resolved compute dtype as a ``torch.dtype``.

        :raises ValueError: while ``dtype`` is still ``"auto"`` (before resolution).
        """
        import torch

        if self.dtype == "auto":
            raise ValueError("dtype is not resolved yet ('auto'); torch_dtype is valid only after resolution")
        return getattr(torch, self.dtype)
