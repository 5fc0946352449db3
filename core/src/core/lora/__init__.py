"""LoRA adapters: many fine-tunes of one base model in one batch.

The engine-facing interface: :class:`LoRARequest` (a request's adapter), :func:`read_config`
(checks an adapter before it is queued) and :class:`LoRAManager` (the model runner's side:
adapters loaded, slots, each step's rows). The products themselves are the platform's
``Kernels.lora_shrink`` / ``Kernels.lora_expand`` (:mod:`plugins.lora`).
"""

from core.lora.adapter import TARGET_MODULES, LoRAAdapter, load_adapter, read_config
from core.lora.manager import LoRAManager
from core.lora.request import LoRARequest

__all__ = ["TARGET_MODULES", "LoRAAdapter", "LoRAManager", "LoRARequest", "load_adapter", "read_config"]
