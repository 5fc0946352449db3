"""One rank of a model: its shard, its KV cache, and the steps it runs.

A :class:`Worker` is what every executor drives: in the engine's own process when the
model is not split, in a worker process per rank (``mp``) or in a Ray actor per rank
(``ray``) when it is. Ranks run the same steps in lock-step; their layers meet in the
communicator's all-reduces, and rank 0 returns the gathered logits.
"""

from __future__ import annotations

import dataclasses

import torch
from plugins import EngineConfigView, Platform
from plugins.memory import KVCachePlan

from core.loader import LoadedModel, ModelSource, load_model
from core.lora import LoRARequest
from core.model_runner import ModelRunner, StepBatch, StepLogits
from core.spec_decode.draft_model import load_draft


class Worker:
    """Loads rank ``config.rank``'s shard of the model on ``platform`` and runs steps on it.

    :param config: the resolved engine settings; ``rank`` is this worker's global rank
        (over data x tensor parallel), ``rank % tensor_parallel_size`` its place in the
        model, ``local_rank`` its CPU set or device on this machine.
    :param model: what to load (an opened :class:`core.loader.ModelSource`, or the name to open).
    :param init_method: the communicator's rendezvous address (needed when the model is split).
    :param load_tokenizer: load the tokenizer too (the driver needs it from one rank).
    :param draft_model: a speculative draft model to load beside the model (one rank only):
        ``draft`` is then its runner, whose KV cache has the model's block count.
    """

    def __init__(
        self,
        platform: Platform,
        config: EngineConfigView,
        model: ModelSource | str | None,
        init_method: str | None = None,
        load_tokenizer: bool = True,
        draft_model: str | None = None,
    ) -> None:
        self.platform = platform
        self.config = config
        self.tp_rank = config.rank % config.tensor_parallel_size
        platform.init_device(config)
        torch.manual_seed(config.seed)
        self.comm = None
        if config.tensor_parallel_size > 1:
            if init_method is None:
                raise ValueError("a tensor-parallel worker needs the communicator's init_method")
            self.comm = platform.make_communicator(self.tp_rank, config.tensor_parallel_size, init_method)
        self.loaded = load_model(
            model,
            kernels=platform.kernels,
            dtype=config.torch_dtype,
            device=platform.torch_device(),
            quantization=config.quantization,
            skip_tokenizer_init=not load_tokenizer,
            byte_order=platform.byte_order,
            comm=self.comm,
        )
        self.runner = ModelRunner(platform, self.loaded, config)
        self.draft = None if draft_model is None else load_draft(platform, config, draft_model, self.loaded)

    def describe(self) -> LoadedModel:
        """What the driver needs of the model (tokenizer, limits, eos ids), without the weights."""
        return dataclasses.replace(self.loaded, model=None)

    def plan_kv_cache(self) -> KVCachePlan:
        """How many KV blocks of this rank's heads (and of the draft model's) fit in this rank's memory."""
        return self.runner.plan_kv_cache(extra_block_bytes=0 if self.draft is None else self.draft.block_bytes)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` (the same on every rank) and prepare the platform's runner
        (and the draft model's cache and runner)."""
        self.runner.allocate_and_prepare(num_blocks)
        if self.draft is not None:
            self.draft.allocate_and_prepare(num_blocks)

    def execute(self, batch: StepBatch) -> StepLogits | None:
        """Run one step; rank 0 returns the logits (every rank holds them after the gather)."""
        logits = self.runner.run(batch)
        return logits if self.tp_rank == 0 else None

    def add_lora(self, request: LoRARequest) -> str | None:
        """Load a LoRA adapter; the reason it cannot be used (returned, so a bad adapter stops no worker), else None."""
        if self.runner.lora is None:
            return "LoRA adapters need enable_lora (--enable-lora)"
        try:
            self.runner.lora.add(request)
        except ValueError as exc:
            return str(exc)
        return None

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter; False when it was not loaded."""
        return self.runner.lora is not None and self.runner.lora.remove(lora_int_id)

    def close(self) -> None:
        """Leave the process group."""
        if self.comm is not None:
            self.comm.close()
