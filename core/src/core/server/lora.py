"""LoRA adapters in the server: ``--lora-modules``, ``model: <adapter>``, ``/v1/models``, runtime load/unload.

The adapters a server knows are named (:class:`ServedLoRAs`): those of ``--lora-modules`` at
start, and, when ``CORE_ALLOW_RUNTIME_LORA_UPDATING`` (or vLLM's ``VLLM_...``) is set, those
``POST /v1/load_lora_adapter`` adds (``/v1/unload_lora_adapter`` forgets one). A request's
``model`` field names the base model or an adapter; an unknown name is a 404.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from plugins import EnvVar
from pydantic import BaseModel

from core.lora import LoRARequest
from core.server.errors import APIError

RUNTIME_UPDATING = EnvVar(
    "ALLOW_RUNTIME_LORA_UPDATING", bool, False, "serve /v1/load_lora_adapter and /v1/unload_lora_adapter"
)


def lora_module(text: str) -> tuple[str, str]:
    """``--lora-modules`` item: ``name=path``, or vLLM's JSON ``{"name": ..., "path": ...}``."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
            return str(spec["name"]), str(spec["path"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"a JSON LoRA module needs 'name' and 'path': {exc}") from None
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"a LoRA module is name=path, got {text!r}")
    return name, path


class LoadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_path: str


class UnloadLoRAAdapterRequest(BaseModel):
    lora_name: str
    lora_int_id: int | None = None


class ServedLoRAs:
    """The adapters the server serves by name, and loading them into every engine replica."""

    def __init__(self, replicas: list[Any], base_model_name: str) -> None:
        self.replicas = replicas
        self.base_model_name = base_model_name
        self.by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def get(self, name: str) -> LoRARequest | None:
        return self.by_name.get(name)

    async def load(self, name: str, path: str) -> LoRARequest:
        """Load an adapter into every replica and serve it as ``name``.

        :raises ValueError: (a 400) a name in use, a bad path, a rank above the maximum, an adapter we cannot apply.
        """
        if name in self.by_name or name == self.base_model_name:
            raise ValueError(f"the name {name!r} is already served: unload it first or pick another")
        request = LoRARequest(name, next(self._ids), path)
        await asyncio.gather(*(replica.add_lora(request) for replica in self.replicas))
        self.by_name[name] = request
        return request

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` (404 when it is not served); requests still running with it finish."""
        request = self.by_name.pop(name, None)
        if request is None:
            raise APIError(404, f"no LoRA adapter named {name!r} is loaded", "lora_name", "model_not_found")
        await asyncio.gather(*(replica.remove_lora(request.lora_int_id) for replica in self.replicas))

    def cards(self, created: int) -> list[dict[str, Any]]:
        """``/v1/models`` entries of the adapters, each naming its ``parent``."""
        return [
            {"id": name, "object": "model", "created": created, "owned_by": "core", "root": request.lora_path,
             "parent": self.base_model_name}
            for name, request in self.by_name.items()
        ]  # fmt: skip


def add_lora_routes(app: Any, loras: ServedLoRAs, errors: dict) -> None:
    """``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (only when runtime updating is allowed)."""
    if not RUNTIME_UPDATING.read():
        return

    @app.post("/v1/load_lora_adapter", responses=errors)
    async def load_lora_adapter(req: LoadLoRAAdapterRequest) -> str:
        await loras.load(req.lora_name, req.lora_path)
        return f"Success: LoRA adapter '{req.lora_name}' added successfully."

    @app.post("/v1/unload_lora_adapter", responses=errors)
    async def unload_lora_adapter(req: UnloadLoRAAdapterRequest) -> str:
        await loras.unload(req.lora_name)
        return f"Success: LoRA adapter '{req.lora_name}' removed successfully."
