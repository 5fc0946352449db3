"""A request's adapter: :class:`LoRARequest`, vLLM's spelling."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """Which LoRA adapter a request runs with.

    :param lora_name: the adapter's name (what the server's ``model`` field selects).
    :param lora_int_id: a positive integer naming the adapter within the engine; two
        requests with the same id must mean the same adapter.
    :param lora_path: the directory peft saved it to (``adapter_config.json`` +
        ``adapter_model.safetensors`` or ``adapter_model.bin``).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be a positive integer, got {self.lora_int_id!r}")
        if not self.lora_name:
            raise ValueError("a LoRA adapter needs a name")

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def prefix_key(self) -> bytes:
        """The root of this adapter's prefix-cache hash chain: KV computed under one adapter
        is never found by a request under another (or none)."""
        return hashlib.sha256(f"lora\0{self.lora_int_id}\0{self.lora_name}\0{self.lora_path}".encode()).digest()
