"""Turns a scheduled batch into model inputs, runs it on the platform, returns logits.

The runner owns the KV cache tensors (one ``(k, v)`` pair per layer, laid out as the platform's
:class:`plugins.kv_cache.KVCacheLayout` says, plus the layer's ``kv_scale`` for an E4M3 cache) and
the only calls into the platform's runner.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch
from plugins import EngineConfigView, Platform
from plugins.attention import AttentionMetadata, build_step
from plugins.kv_cache import needs_scale, new_kv_scale
from plugins.memory import KVCachePlan
from plugins.runner import ModelInputs, Runner

from core.loader import LoadedModel
from core.lora import LoRAManager, LoRARequest
from core.partition.pipeline import PipelineStage
from core.scheduler import ScheduledSeq

logger = logging.getLogger(__name__)


@dataclass
class StepLogits:
    """Logits of one step: a row per sequence that samples (k + 1 rows, in position order, for
    one with k drafts), and prompt-position rows for sequences that asked for prompt logprobs
    (keyed by seq_id, with the chunk's first position)."""

    sample_logits: torch.Tensor  # float32 [num_sample_rows, vocab]
    sample_seq_ids: list[int]
    prompt_logits: dict[int, tuple[int, torch.Tensor]]


class ModelRunner:
    """Runs the model of ``loaded`` on ``platform`` for batches chosen by the scheduler.

    :param runner: the platform runner it binds its model and KV cache to: the platform's own
        by default; a second model in the same worker (a speculative draft model) passes a
        fresh one (``platform.make_runner()``).
    :param stage: the pipeline stage ``loaded`` holds (default: the whole model): a stage after
        the first runs on the previous stage's output, one before the last computes no logits.
    """

    def __init__(
        self,
        platform: Platform,
        loaded: LoadedModel,
        config: EngineConfigView,
        runner: Runner | None = None,
        stage: PipelineStage | None = None,
    ) -> None:
        self.platform = platform
        self.stage = stage or PipelineStage.whole(loaded.num_layers)
        self.runner = platform.runner if runner is None else runner
        self.loaded = loaded
        self.model = loaded.model
        self.config = config
        self.dtype = config.torch_dtype
        self.kv_layout = platform.kv_cache_layout(config, loaded.num_kv_heads, loaded.head_size)
        self.device = platform.torch_device()
        self.kv_caches: list[tuple[torch.Tensor, ...]] = []
        self.lora: LoRAManager | None = None
        if config.enable_lora:  # the adapters' slots are allocated now, before the KV cache is sized
            self.lora = LoRAManager(self.model, config.max_loras, config.max_lora_rank, config.max_cpu_loras)

    # -- KV cache ---------------------------------------------------------------------
    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block across all layers, K and V, as the platform lays them out."""
        return self.loaded.num_layers * self.kv_layout.block_bytes

    def _allocate(self, num_blocks: int) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's ``(k_cache, v_cache)``, with a fresh ``kv_scale`` (set by the first
        write) for an E4M3 cache: the profile pass's caches and scales are thrown away."""
        k_shape, v_shape = self.kv_layout.shapes(num_blocks)
        dtype, memory = self.kv_layout.dtype, self.platform.memory
        scaled = needs_scale(dtype)
        return [
            (
                memory.allocate_kv_cache(k_shape, dtype, self.device),
                memory.allocate_kv_cache(v_shape, dtype, self.device),
                *((new_kv_scale(self.device),) if scaled else ()),
            )
            for _ in range(self.loaded.num_layers)
        ]

    def profile_run(self) -> None:
        """One forward pass at the largest batch the scheduler may build (for the memory profiler)."""
        num_tokens = min(self.config.max_num_batched_tokens, self.config.max_num_seqs * self.config.max_model_len)
        seq_len = min(num_tokens, self.config.max_model_len)
        lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
        blocks_per_seq = [-(-n // self.config.block_size) for n in lens]
        caches = self._allocate(sum(blocks_per_seq))
        tables, start = [], 0
        for n in blocks_per_seq:
            tables.append(list(range(start, start + n)))
            start += n
        meta = AttentionMetadata.build(lens, lens, tables, self.config.block_size, device=self.device)
        ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.cat([torch.arange(n, device=self.device) for n in lens])
        runner = self.runner
        with runner.grad_mode():
            hidden = runner.profile(
                self.model, caches, ModelInputs(ids, positions, meta, None, self._zeros(num_tokens))
            )
            if self.stage.is_last:
                self.model.compute_logits(hidden[-self.config.max_num_seqs :])
        self.platform.synchronize()

    def plan_kv_cache(self, extra_block_bytes: int = 0) -> KVCachePlan:
        """The KV plan, settled once: the profile pass (if the platform's profiler needs it),
        the platform's budget in blocks, then core's bounds (enough for one full-length
        sequence, no more than can ever be used).

        :param extra_block_bytes: bytes each block also takes in another cache indexed by the
            same block ids (a draft model's), so that both fit the budget.
        """
        memory = self.platform.memory
        peak = memory.measure_peak(self.profile_run) if memory.needs_profile_run else 0
        plan = memory.plan_kv_cache(self.config, self.block_bytes + extra_block_bytes, peak_activation_bytes=peak)
        logger.info("%s", plan.detail)
        if self.kv_layout.description:
            logger.info("KV cache layout of %s: %s", self.platform.name, self.kv_layout.description)
        min_blocks = -(-self.config.max_model_len // self.config.block_size)
        # more blocks than max_num_seqs full-length sequences (x2: room for the prefix cache) buy nothing
        useful = 2 * self.config.max_num_seqs * min_blocks
        if plan.num_blocks > useful:
            logger.info(
                "using %d of %d KV blocks: enough for 2 x max_num_seqs x max_model_len", useful, plan.num_blocks
            )
            plan = replace(plan, num_blocks=useful)
        if plan.num_blocks < min_blocks:
            raise ValueError(
                f"the KV cache holds {plan.num_blocks} blocks ({plan.num_blocks * self.config.block_size} tokens) but one "
                f"sequence of max_model_len={self.config.max_model_len} needs {min_blocks}: give the KV cache more "
                "memory or lower --max-model-len"
            )
        return plan

    def allocate_and_prepare(self, num_blocks: int) -> None:
        """Allocate the KV cache and bind it, with the model, to the platform's runner."""
        self.kv_caches = self._allocate(num_blocks)
        self.runner.prepare(self.model, self.kv_caches, self.config)

    # -- one step -----------------------------------------------------------------------
    def _zeros(self, num_tokens: int) -> torch.Tensor | None:
        """A stage after the first: a stand-in for the previous stage's output (the profile pass's)."""
        if self.stage.is_first:
            return None
        return torch.zeros(num_tokens, 2 * self.loaded.hf_config.hidden_size, dtype=self.dtype, device=self.device)

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        """Run the forward pass of one scheduled batch and compute the logits it needs."""
        return self.run(make_batch(scheduled))

    def run(self, batch: StepBatch) -> StepLogits:
        """Run the forward pass of a flattened batch and compute the logits it needs."""
        return self.logits(batch, self.forward(batch))

    def forward(self, batch: StepBatch, intermediate: torch.Tensor | None = None) -> torch.Tensor:
        """Run the model (its stage) on a flattened batch: the final hidden states, or on a pipeline
        stage before the last its hidden states and residual (:class:`plugins.runner.ModelInputs`).

        :param intermediate: on a stage after the first, the previous stage's output for the batch.
        """
        if (intermediate is None) != self.stage.is_first:
            raise ValueError(f"pipeline stage {self.stage.rank} takes the previous stage's output, and only then")
        runner = self.runner
        meta, (input_ids, positions) = build_step(
            batch.query_lens, batch.seq_lens, batch.block_tables, self.config.block_size,
            [batch.input_ids, batch.positions], runner.stage,
        )  # fmt: skip
        lora = None
        if batch.loras is not None:
            if self.lora is None:
                raise ValueError("a step with LoRA adapters on an engine without enable_lora")
            lora = self.lora.activate(batch.loras, batch.query_lens, self.device)
        inputs = ModelInputs(input_ids, positions, meta, lora, intermediate)
        with runner.grad_mode():
            try:
                return runner.execute(inputs)
            finally:
                if lora is not None:
                    self.lora.deactivate()

    def logits(self, batch: StepBatch, hidden: torch.Tensor) -> StepLogits:
        """The logits ``batch`` needs from the final hidden states ``hidden`` (of the last stage)."""
        runner = self.runner
        with runner.grad_mode():
            sample_logits = runner.compute_logits(hidden, batch.sample_rows)
            prompt_logits = {
                seq_id: (first_pos, runner.compute_logits(hidden, list(range(lo, hi))))
                for seq_id, (first_pos, lo, hi) in batch.prompt_rows.items()
            }
        return StepLogits(sample_logits, batch.sample_seq_ids, prompt_logits)


def join_logits(parts: list[StepLogits]) -> StepLogits:
    """One step's logits from those of its consecutive micro-batches (pipeline parallelism)."""
    if len(parts) == 1:
        return parts[0]
    return StepLogits(
        torch.cat([p.sample_logits for p in parts]),
        [seq_id for p in parts for seq_id in p.sample_seq_ids],
        {seq_id: rows for p in parts for seq_id, rows in p.prompt_logits.items()},
    )


@dataclass
class StepBatch:
    """One step's batch as plain lists (cheap to send to the workers of a split model)."""

    input_ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]  # the row of each sampling sequence's last new token (and of each draft)
    sample_seq_ids: list[int]
    prompt_rows: dict[int, tuple[int, int, int]]  # seq_id -> (first position, first row, end row)
    loras: list[LoRARequest | None] | None = None  # each sequence's adapter; None when none has one


def make_batch(scheduled: list[ScheduledSeq]) -> StepBatch:
    """Flatten the scheduler's choice into one step's batch."""
    ids: list[int] = []
    positions: list[int] = []
    query_lens, seq_lens, tables = [], [], []
    sample_rows, sample_seq_ids = [], []
    prompt_rows: dict[int, tuple[int, int, int]] = {}
    for item in scheduled:
        seq, n, start, drafts = item.seq, item.num_new_tokens, item.start_pos, item.draft_token_ids
        row0 = len(ids)
        positions.extend(range(start, start + n))
        query_lens.append(n)
        seq_lens.append(start + n)
        tables.append(seq.block_table)
        if drafts:  # the last token, then the drafts: each of the k + 1 rows samples
            ids.append(seq.token_ids[start])
            ids.extend(drafts)
            sample_rows.extend(range(row0, row0 + n))
            sample_seq_ids.append(seq.seq_id)
            continue
        ids.extend(seq.token_ids[start : start + n])
        if item.needs_sample:
            sample_rows.append(row0 + n - 1)
            sample_seq_ids.append(seq.seq_id)
        if seq.params.prompt_logprobs is not None and start < seq.num_prompt_tokens - 1:
            end = min(start + n, seq.num_prompt_tokens - 1)  # the last prompt row predicts the first output
            prompt_rows[seq.seq_id] = (start, row0, row0 + end - start)
    loras = [item.seq.lora for item in scheduled]
    return StepBatch(ids, positions, query_lens, seq_lens, tables, sample_rows, sample_seq_ids, prompt_rows,
                     loras if any(loras) else None)  # fmt: skip
