"""The model side of LoRA: adapters loaded (least recently used evicted), slots, each step's rows.

:class:`LoRAManager` is what core's model runner calls: :meth:`~LoRAManager.add` loads and
checks an adapter against the model, :meth:`~LoRAManager.activate` puts a step's adapters
in slots and maps its rows to them, :meth:`~LoRAManager.deactivate` ends the step.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import torch
from plugins.lora import LoRAMapping

from core.lora.adapter import LoRAAdapter, load_adapter
from core.lora.request import LoRARequest
from core.lora.stacks import MODULE_PARTS, attach

logger = logging.getLogger(__name__)

# an adapter's weights grouped by the stacked linear they go into: (layer, path) -> {part: (A, B)}
Grouped = dict[tuple[int, str], dict[int, tuple[torch.Tensor, torch.Tensor]]]


class LoRAManager:
    """Adapters for ``model``: ``max_loras`` slots in every adapted linear, up to ``max_cpu_loras``
    adapters kept loaded (on the host), each of rank ``max_lora_rank`` at most (the settings are
    checked when the engine's config is resolved)."""

    def __init__(self, model: Any, max_loras: int, max_lora_rank: int, max_cpu_loras: int) -> None:
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.num_layers = model.num_layers
        self.plan = model.tp.plan  # a tensor-parallel rank holds its part of each adapter, as of each layer
        self.context, self.stacks = attach(model, max_loras, max_lora_rank)
        self._loaded: OrderedDict[int, tuple[LoRARequest, Grouped]] = OrderedDict()  # least recently used first
        self._slot_of: dict[int, int] = {}  # adapter id -> slot holding it
        self._slots: OrderedDict[int, int | None] = OrderedDict((s, None) for s in range(max_loras))  # LRU first

    @property
    def loaded(self) -> list[LoRARequest]:
        """The adapters held, least recently used first."""
        return [request for request, _ in self._loaded.values()]

    def add(self, request: LoRARequest) -> None:
        """Load ``request``'s adapter and check it against the model (nothing when it is held).

        :raises ValueError: a bad path, an adapter we cannot apply, a rank above the maximum,
            or weights that do not fit the model's projections.
        """
        held = self._loaded.get(request.lora_int_id)
        if held is not None and held[0] == request:
            self._loaded.move_to_end(request.lora_int_id)
            return
        grouped = self._group(load_adapter(request, self.max_lora_rank))
        self.remove(request.lora_int_id)  # an id given to another adapter: that one goes
        self._loaded[request.lora_int_id] = (request, grouped)
        while len(self._loaded) > self.max_cpu_loras:
            evicted, _ = self._loaded.popitem(last=False)
            self._free_slot(evicted)
            logger.info("LoRA adapter id %d evicted (max_cpu_loras=%d)", evicted, self.max_cpu_loras)

    def remove(self, lora_int_id: int) -> bool:
        """Forget an adapter; False when it was not held."""
        self._free_slot(lora_int_id)
        return self._loaded.pop(lora_int_id, None) is not None

    def activate(self, seq_loras: list[LoRARequest | None], query_lens: list[int],
                 device: torch.device) -> LoRAMapping | None:  # fmt: skip
        """Put this step's adapters in slots and map its rows (``query_lens[i]`` rows of sequence
        ``i``) to them; None (and nothing set) when no sequence has an adapter."""
        wanted = {r.lora_int_id: r for r in seq_loras if r is not None}
        if not wanted:
            return None
        if len(wanted) > len(self._slots):
            raise RuntimeError(f"{len(wanted)} adapters in one step, more than max_loras={len(self._slots)}")
        for request in wanted.values():
            self.add(request)  # reloads one evicted while requests still use it
            self._put_in_slot(request.lora_int_id, busy=wanted.keys())
        row_slots: list[int] = []
        for request, n in zip(seq_loras, query_lens, strict=True):
            row_slots += [-1 if request is None else self._slot_of[request.lora_int_id]] * n
        self.context.mapping = LoRAMapping.build(row_slots, device)
        return self.context.mapping

    def deactivate(self) -> None:
        """The step is over: linears add nothing until the next :meth:`activate`."""
        self.context.mapping = None

    def _put_in_slot(self, lora_int_id: int, busy: Any) -> None:
        slot = self._slot_of.get(lora_int_id)
        if slot is None:
            slot = next(s for s, held in self._slots.items() if held is None or held not in busy)
            self._free_slot(self._slots[slot])
            grouped = self._loaded[lora_int_id][1]
            for key, stack in self.stacks.items():
                stack.set_slot(slot, grouped.get(key, {}))
            self._slots[slot], self._slot_of[lora_int_id] = lora_int_id, slot
        self._slots.move_to_end(slot)

    def _free_slot(self, lora_int_id: int | None) -> None:
        slot = self._slot_of.pop(lora_int_id, None) if lora_int_id is not None else None
        if slot is not None:
            self._slots[slot] = None
            self._slots.move_to_end(slot, last=False)

    def _group(self, adapter: LoRAAdapter) -> Grouped:
        """The adapter's weights by stacked linear, checked against the model's shapes."""
        where = f"LoRA adapter {adapter.request.lora_name!r}"
        grouped: Grouped = {}
        for (layer, module), (a, b) in adapter.weights.items():
            path, part = MODULE_PARTS[module]
            stack = self.stacks.get((layer, path))
            if stack is None:
                what = f"layer {layer}" if layer >= self.num_layers else f"layer {layer}'s {module}"
                raise ValueError(f"{where} adapts {what}, which the model (of {self.num_layers} layers) lacks")
            a, b = self._shard(where, layer, module, a, b)
            if a.shape[1] != stack.in_features or b.shape[0] != stack.parts[part]:
                raise ValueError(
                    f"{where}: layer {layer} {module} maps {a.shape[1]} -> {b.shape[0]} features, "
                    f"the model's {stack.in_features} -> {stack.parts[part]}"
                )
            grouped.setdefault((layer, path), {})[part] = (a, b)
        return grouped

    def _shard(self, where: str, layer: int, module: str, a: torch.Tensor,
               b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """This rank's part of a module's ``(A, B)``, split as the module's weight is: a column-parallel
        projection (output rows split) keeps its rows of ``B``; a row-parallel one (o, down: input
        columns split, the ranks' outputs summed after it) its columns of ``A``, so the ranks'
        partial deltas sum to the whole one. Unsplit: both whole."""
        group = MODULE_PARTS[module][0].split(".")[0]  # self_attn or mlp
        part = self.plan.slice_for(f"model.layers.{layer}.{group}.{module}.weight")
        if part is None:
            return a, b
        size = b.shape[0] if part.dim == 0 else a.shape[1]
        # the last rank's part ends where the whole dimension does: ranks' errors are all reported
        if size < part.stop or (self.plan.rank == self.plan.world_size - 1 and size != part.stop):
            what, least = "output" if part.dim == 0 else "input", "" if size > part.stop else "at least "
            raise ValueError(f"{where}: layer {layer} {module} has {size} {what} features, the model's (split over "
                             f"{self.plan.world_size} ranks) {least}{part.stop}")  # fmt: skip
        if part.dim == 0:
            return a, b[part.start : part.stop]
        return a[:, part.start : part.stop], b
