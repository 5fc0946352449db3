"""What every executor shares: the in-process one, the base of the remote ones, and their failure.

- :class:`LocalExecutor`: one unsplit model in the engine's own process.
- :class:`RemoteExecutor`: workers in other processes, driven in lock-step; subclassed by
  :class:`core.distributed.mp_executor.MultiprocExecutor` (``--distributed-executor-backend mp``)
  and :class:`core.distributed.ray_executor.RayExecutor` (``ray``).

:func:`core.distributed.launch.make_executor` picks one. The engine (scheduler and sampler)
stays in the driver. Every executor exposes ``loaded`` (the model's tokenizer and limits),
``kv_plan``, :meth:`execute`, :meth:`check_health` (for an idle engine) and :meth:`shutdown`.
A worker that dies, fails or stops answering raises :class:`WorkerFailed` naming its rank,
after every worker has been stopped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from plugins import EngineConfigView, Platform

from core.distributed.worker import Worker
from core.loader import ModelSource
from core.lora import LoRARequest
from core.model_runner import StepLogits, make_batch
from core.scheduler import ScheduledSeq

logger = logging.getLogger(__name__)

#: seconds a worker may go without a heartbeat (mp) or an answer (ray) before it counts as hung
HANG_TIMEOUT_S = float(os.environ.get("CORE_WORKER_HANG_TIMEOUT", "20"))
#: seconds the workers may take to load the model and plan their KV caches
STARTUP_TIMEOUT_S = 900.0


class WorkerFailed(RuntimeError):
    """A worker of a split model died, raised or hung; ``rank`` names it (its rank within its replica)."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"worker rank {rank} failed: {reason}")
        self.rank = rank


class LocalExecutor:
    """The model in the engine's own process (not split over ranks); ``draft``: the
    speculative draft model's runner when ``draft_model`` names one, else None."""

    def __init__(
        self,
        platform: Platform,
        config: EngineConfigView,
        model: ModelSource,
        load_tokenizer: bool,
        draft_model: str | None = None,
    ) -> None:
        self.worker = Worker(platform, config, model, load_tokenizer=load_tokenizer, draft_model=draft_model)
        self.runner = self.worker.runner
        self.draft = self.worker.draft
        self.loaded = self.worker.loaded
        self.kv_plan = self.worker.plan_kv_cache()
        self.worker.allocate_kv_cache(self.kv_plan.num_blocks)

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        return self.runner.execute(scheduled)

    def add_lora(self, request: LoRARequest) -> None:
        """Load and check a LoRA adapter (:meth:`core.lora.LoRAManager.add`).

        :raises ValueError: when it cannot be used, saying why.
        """
        if error := self.worker.add_lora(request):
            raise ValueError(error)

    def remove_lora(self, lora_int_id: int) -> bool:
        return self.worker.remove_lora(lora_int_id)

    def check_health(self) -> None:
        """Nothing to watch: the model runs in this process."""

    def shutdown(self) -> None:
        self.worker.close()


class RemoteExecutor:
    """Workers in other processes: start them, agree on a KV cache size, run steps in lock-step.

    Under pipeline parallelism a step's batch goes to every worker as up to
    ``pipeline_parallel_size`` micro-batches (:func:`micro_batches`), which the stages run one
    after another, overlapping (:meth:`core.distributed.worker.Worker.execute_pipelined`).
    Subclasses start the workers, set :attr:`config` and implement :meth:`call_all`.
    """

    num_workers: int
    config: EngineConfigView
    #: no speculative draft model: it runs with one rank (:func:`core.distributed.launch.make_executor`)
    draft = None

    def setup(self) -> None:
        """Load on every rank, size every rank's KV cache to the smallest rank's plan."""
        descriptions = self.call_all("describe", timeout=STARTUP_TIMEOUT_S)
        plans = self.call_all("plan_kv_cache", timeout=STARTUP_TIMEOUT_S)  # each stage's for its own layers
        self.kv_plan = min(plans, key=lambda p: p.num_blocks)
        logger.info(
            "KV blocks per rank: %s; every rank uses %d", [p.num_blocks for p in plans], self.kv_plan.num_blocks
        )
        self.call_all("allocate_kv_cache", self.kv_plan.num_blocks, timeout=STARTUP_TIMEOUT_S)
        self.loaded = descriptions[0]

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        config = self.config
        if config.pipeline_parallel_size == 1:
            return self.call_all("execute", make_batch(scheduled), timeout=None)[0]
        parts = [make_batch(part) for part in micro_batches(scheduled, config.pipeline_parallel_size)]
        # the last stage's first tensor-parallel rank returns the logits
        return self.call_all("execute_pipelined", parts, timeout=None)[config.world_size - config.tensor_parallel_size]

    def add_lora(self, request: LoRARequest) -> None:
        """Load and check a LoRA adapter on every rank; ValueError (the first rank's reason) when it cannot be used."""
        errors = [e for e in self.call_all("add_lora", request, timeout=STARTUP_TIMEOUT_S) if e]
        if errors:
            raise ValueError(errors[0])

    def remove_lora(self, lora_int_id: int) -> bool:
        return any(self.call_all("remove_lora", lora_int_id, timeout=STARTUP_TIMEOUT_S))

    def check_health(self) -> None:
        """Raise :class:`WorkerFailed` (all workers stopped) when a worker died or hung."""
        raise NotImplementedError

    def call_all(self, method: str, *args: Any, timeout: float | None) -> list[Any]:
        """Call ``Worker.<method>(*args)`` on every rank; the results in rank order.

        :param timeout: seconds to wait for all answers; None: as long as every worker
            is alive and not hung.
        :raises WorkerFailed: naming the first rank that died, raised or hung (all are stopped).
        """
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


def worker_configs(config: EngineConfigView) -> list[EngineConfigView]:
    """Each rank's view of ``config`` (global ranks from ``config.rank``, the replica's first)."""
    return [
        dataclasses.replace(config, rank=config.rank + r, local_rank=config.local_rank + r)
        for r in range(config.world_size)
    ]


def micro_batches(scheduled: list[ScheduledSeq], n: int) -> list[list[ScheduledSeq]]:
    """``scheduled`` in order, cut into at most ``n`` runs of sequences with about equal numbers
    of new tokens (fewer when there are fewer sequences; none empty)."""
    total = sum(item.num_new_tokens for item in scheduled)
    parts: list[list[ScheduledSeq]] = [[]]
    done = 0
    for item in scheduled:
        if parts[-1] and len(parts) < n and done >= total * len(parts) / n:
            parts.append([])
        parts[-1].append(item)
        done += item.num_new_tokens
    return parts
