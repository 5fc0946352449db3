"""One rank of a model: its shard, its KV cache, and the steps it runs.

A :class:`Worker` is what every executor drives: in the engine's own process when the
model is not split, in a worker process per rank (``mp``) or in a Ray actor per rank
(``ray``) when it is. Ranks run the same steps in lock-step. The tensor-parallel ranks of
a stage meet in their communicator's all-reduces; under pipeline parallelism each stage
runs its layers on the step's micro-batches one after another, receiving each one's hidden
states from the stage before and sending its own to the stage after (so stage ``i`` runs
micro-batch ``j`` while stage ``i + 1`` runs ``j - 1``), and the last stage's first
tensor-parallel rank returns the logits (:attr:`Worker.returns_logits`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from plugins import EngineConfigView, Platform
from plugins.memory import KVCachePlan

from core.loader import LoadedModel, ModelSource, load_model, open_model
from core.lora import LoRARequest
from core.model_runner import ModelRunner, StepBatch, StepLogits, join_logits
from core.partition.pipeline import PipelineStage
from core.spec_decode.draft_model import load_draft


class Worker:
    """Loads rank ``config.rank``'s shard of the model on ``platform`` and runs steps on it.

    :param config: the resolved engine settings; ``rank`` is this worker's global rank
        (over data x pipeline x tensor parallel): within its replica (``rank % world_size``)
        ``pipeline_rank * tensor_parallel_size + tensor_parallel_rank``; ``local_rank`` its
        CPU set or device on this machine.
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
        tp, pp, world = config.tensor_parallel_size, config.pipeline_parallel_size, config.world_size
        rank = config.rank % world
        self.tp_rank, self.pp_rank = rank % tp, rank // tp
        platform.init_device(config)
        torch.manual_seed(config.seed)
        #: all-reduces with this stage's tensor-parallel ranks; sends to and receives from the
        #: neighbouring stages' ranks of this tensor-parallel place (None: the model is not split so)
        self.comm = self.pp_comm = None
        if world > 1 and init_method is None:
            raise ValueError("a worker of a split model needs the communicator's init_method")
        if pp == 1 and tp > 1:
            self.comm = platform.make_communicator(rank, world, init_method)
        elif pp > 1:  # the stage's group first: it joins the process group (closed last)
            if tp > 1:
                stage_ranks = range(self.pp_rank * tp, (self.pp_rank + 1) * tp)
                self.comm = platform.make_communicator(rank, world, init_method, ranks=stage_ranks)
            self.pp_comm = platform.make_communicator(rank, world, init_method, ranks=range(self.tp_rank, world, tp))
        self.stage = None
        if pp > 1:
            model = model if isinstance(model, ModelSource) else open_model(model)
            self.stage = PipelineStage.build(model.hf_config.num_hidden_layers, self.pp_rank, pp)
        self.loaded = load_model(
            model,
            kernels=platform.kernels,
            dtype=config.torch_dtype,
            device=platform.torch_device(),
            quantization=config.quantization,
            skip_tokenizer_init=not load_tokenizer,
            byte_order=platform.byte_order,
            comm=self.comm,
            stage=self.stage,
        )
        self.runner = ModelRunner(platform, self.loaded, config, stage=self.stage)
        self.draft = None if draft_model is None else load_draft(platform, config, draft_model, self.loaded)

    @property
    def returns_logits(self) -> bool:
        """Whether :meth:`execute` returns the step's logits: the last stage's first tensor-parallel rank."""
        return self.tp_rank == 0 and (self.stage is None or self.stage.is_last)

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
        """Run one step; the logits where :attr:`returns_logits` (every rank of the last stage
        holds them after the gather), else None."""
        logits = self.runner.run(batch)
        return logits if self.returns_logits else None

    def execute_pipelined(self, micro_batches: list[StepBatch]) -> StepLogits | None:
        """Run this stage on each of a step's micro-batches in turn (see the module docstring);
        the logits of all of them, in order, where :attr:`returns_logits`, else None."""
        stage, comm, runner = self.stage, self.pp_comm, self.runner
        width = 2 * self.loaded.hf_config.hidden_size
        sent: list[tuple[torch.Tensor, Callable[[], None]]] = []  # kept until they have gone
        logits = []
        for batch in micro_batches:
            intermediate = None
            if not stage.is_first:
                intermediate = torch.empty(len(batch.input_ids), width, dtype=self.config.torch_dtype,
                                           device=self.platform.torch_device())  # fmt: skip
                comm.recv(intermediate, stage.rank - 1)
            hidden = runner.forward(batch, intermediate)
            if stage.is_last:
                logits.append(runner.logits(batch, hidden))
            else:
                sent.append((hidden, comm.send(hidden, stage.rank + 1)))
        for _, wait in sent:
            wait()
        return join_logits(logits) if self.returns_logits else None

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
        for comm in (self.pp_comm, self.comm):  # the one that joined the process group last
            if comm is not None:
                comm.close()
