"""LoRA adapters: many fine-tunes of one base model in one batch.

The engine-facing interface: :class:`LoRARequest` (a request's adapter) and
:class:`LoRAManager` (the model runner's side: adapters loaded and checked, slots, each step's
rows). The products themselves are the platform's
``Kernels.lora_shrink`` / ``Kernels.lora_expand`` (:mod:`plugins.lora`).
"""

from core.lora.manager import LoRAManager
from core.lora.request import LoRARequest

__all__ = ["LoRAManager", "LoRARequest"]
