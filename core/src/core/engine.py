"""The synchronous engine: ``add_request`` then ``step`` until done.

A step reads ``schedule -> run -> sample -> update -> outputs``: the scheduler picks
tokens, the model runner runs them on the platform, the sampler picks next tokens, the
scheduler and each request's state take them (the state decides stop and max_tokens,
the scheduler caps length at max_model_len and the cache), and the states build outputs.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import itertools
import logging
import time
from concurrent.futures import Future
from typing import Any

import torch

from core.block_manager import BlockManager
from core.config import EngineConfig
from core.distributed.launch import make_executor
from core.lora import LoRARequest
from core.model_runner import StepLogits
from core.outputs import RequestOutput
from core.request_state import Completion, RequestState, build_request
from core.resolve import resolve_engine
from core.sampler import DraftRun, Sampler, SamplerOutput, SamplingState
from core.sampling_params import SamplingParams
from core.scheduler import ScheduledSeq, Scheduler, SchedulerOutput
from core.sequence import Sequence, SequenceStatus
from core.spec_decode import DraftModel, SpecDecoder, SpeculativeConfig, num_accepted, row_outputs
from core.structured import StructuredOutputs

logger = logging.getLogger(__name__)
# engines gc.freeze() what they keep (LLMEngine.__init__); at exit it goes back to the
# collector, so the interpreter's last collection frees it (no leak reports at exit)
atexit.register(gc.unfreeze)


class LLMEngine:
    """Owns the model, KV cache, scheduler and sampler of one platform.

    Build it in the thread that will step it: with one rank the platform's
    ``init_device`` runs here, once, and may bind the calling thread; a model split over
    ranks (or one replica of several) runs in the executor's worker processes.
    """

    def __init__(self, config: EngineConfig, skip_tokenizer_init: bool = False, data_parallel_rank: int = 0) -> None:
        """:param data_parallel_rank: which of ``config.data_parallel_size`` replicas this engine is
        (its workers take global ranks from ``data_parallel_rank * world_size``)."""
        started = time.perf_counter()
        spec = None if config.speculative_config is None else SpeculativeConfig.from_dict(config.speculative_config)
        resolved = resolve_engine(config)
        first_rank = data_parallel_rank * resolved.config.world_size
        self.platform = resolved.platform
        self.config = config = dataclasses.replace(resolved.config, rank=first_rank, local_rank=first_rank)
        torch.manual_seed(config.seed)
        draft_model = spec.model if spec is not None and spec.method == "draft_model" else None
        self.executor = make_executor(
            self.platform, config, resolved.model, load_tokenizer=not skip_tokenizer_init, draft_model=draft_model
        )
        self.loaded = self.executor.loaded
        self.tokenizer = self.loaded.tokenizer
        self.kv_plan = self.executor.kv_plan
        self.block_manager = BlockManager(self.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
            kv_window=self.loaded.kv_window,
            max_loras=config.max_loras if config.enable_lora else None,
        )
        self.sampler = Sampler(stage=self.platform.runner.stage)
        self.spec = None
        if spec is not None:
            draft = None
            if self.executor.draft is not None:
                draft = DraftModel(self.executor.draft, self.sampler, config.max_num_batched_tokens)
            self.spec = SpecDecoder(spec, config.max_model_len, draft)
        self.structured = StructuredOutputs(
            config.structured_outputs_backend,
            self.tokenizer,
            self.loaded.hf_config.vocab_size,
            self.loaded.eos_token_ids,
            config.reasoning_parser,
        )
        self.requests: dict[str, RequestState] = {}
        self._seq_ids = itertools.count()
        self._by_seq: dict[int, tuple[RequestState, Completion]] = {}
        tokens = self.kv_plan.num_blocks * config.block_size
        # what lives as long as the engine (model, tokenizer tables: ~10^6 objects) leaves the
        # collector's generations, so the full collections that generation triggers do not
        # walk it again and again (gc was ~1.5% of a batched run's CPU time before)
        gc.collect()
        gc.freeze()
        # the element type the platform lays the cache out in (its own, e.g. OpenVINO's u8 codes)
        kv_dtype = self.platform.kv_cache_layout(config, self.loaded.num_kv_heads, self.loaded.head_size).dtype
        logger.info(
            "engine ready in %.1fs: device=%s model=%s dtype=%s quantization=%s; KV cache (%s) %d blocks = %d tokens, "
            "max concurrency at max_model_len=%d: %.1fx",
            time.perf_counter() - started,
            self.platform.name,
            self.loaded.name,
            config.dtype,
            config.quantization,
            str(kv_dtype).removeprefix("torch."),
            self.kv_plan.num_blocks,
            tokens,
            config.max_model_len,
            tokens / config.max_model_len,
        )

    # -- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this engine was started without a tokenizer: pass prompt_token_ids")
        return self.tokenizer.encode(prompt)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, chat_template: str | None = None
    ) -> list[int]:
        """Token ids of a conversation rendered with the model's (or the given) chat template."""
        if self.tokenizer is None:
            raise ValueError("this engine was started without a tokenizer: chat needs one")
        template = chat_template or self.tokenizer.chat_template
        if template is None:
            raise ValueError(
                f"model {self.loaded.name} has no chat template; pass one (the request's chat_template, "
                "or core serve --chat-template)"
            )
        text = self.tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.tokenizer.encode(text, add_special_tokens=False)

    def add_request(
        self,
        request_id: str,
        prompt: str | None = None,
        params: SamplingParams | None = None,
        prompt_token_ids: list[int] | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> None:
        """Queue a request (with ``lora_request``: under that LoRA adapter, loaded now if it is not).
        Raises ValueError (naming the problem) when it can never run."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        if lora_request is not None:
            self.add_lora(lora_request)
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("a request needs a prompt or prompt_token_ids")
            prompt_token_ids = self.tokenize(prompt)
        state = build_request(
            request_id,
            prompt,
            list(prompt_token_ids),
            params or SamplingParams(),
            seq_ids=self._seq_ids,
            tokenizer=self.tokenizer,
            vocab_size=self.loaded.hf_config.vocab_size,
            eos_token_ids=self.loaded.eos_token_ids,
            max_model_len=self.config.max_model_len,
            device=self.platform.runner.io_device(),
            arrival_time=arrival_time if arrival_time is not None else time.time(),
            priority=priority,
            lora=lora_request,
        )
        num_tokens = len(state.prompt_token_ids) + state.params.max_tokens
        if not self.scheduler.can_ever_fit(num_tokens):
            raise ValueError(
                f"request needs {num_tokens} tokens of KV cache; the whole cache holds "
                f"{self.kv_plan.num_blocks * self.config.block_size}"
            )
        spec = state.params.structured_outputs
        if spec is not None:  # compiled once (cached): the server compiled it already, off this thread
            for c in state.completions:
                c.matcher = self.structured.matcher(spec)
        self.requests[request_id] = state
        for c in state.completions:
            self._by_seq[c.seq.seq_id] = (state, c)
            self.scheduler.add(c.seq)

    def add_lora(self, lora_request: LoRARequest) -> None:
        """Load a LoRA adapter (kept until evicted, least recently used, beyond ``max_cpu_loras``).

        :raises ValueError: LoRA not enabled, a bad path, an adapter we cannot apply, or a
            rank above ``max_lora_rank`` (naming both).
        """
        if not self.config.enable_lora:
            raise ValueError("LoRA adapters need an engine with enable_lora=True (core serve --enable-lora)")
        self.executor.add_lora(lora_request)

    def remove_lora(self, lora_int_id: int) -> bool:
        """Unload a LoRA adapter (requests still using it reload it); False when it was not loaded."""
        return self.config.enable_lora and self.executor.remove_lora(lora_int_id)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """Abort a waiting or running request; returns its final output, None if unknown."""
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        self.scheduler.abort(request_id)
        self._forget(state)
        return state.to_output()

    def _forget(self, state: RequestState) -> None:
        for c in state.completions:
            self._by_seq.pop(c.seq.seq_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- one step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; return the outputs of every request that progressed."""
        drafts = self._propose() if self.spec is not None else None
        sched = self.scheduler.schedule(drafts)
        if sched.is_empty:
            return []
        draft_probs = {}
        if self.spec is not None and self.spec.draft is not None:  # into the draft slots just reserved
            draft_probs = self.spec.draft.propose(sched.scheduled, self._sampling_state, self._matcher, self._constrain)
        self._mark_scheduled(sched.scheduled)
        masks = self._bitmask_soon(sched.scheduled)
        try:
            logits = self.executor.execute(sched.scheduled)
        finally:  # the matchers are free again (to advance) only once their fill is done
            early = None if masks is None else (masks[0], masks[1], masks[2].result())
        return self._finish_step(sched, logits, early, draft_probs)

    def _bitmask_soon(self, scheduled: list[ScheduledSeq]) -> tuple[list[Any], dict[int, list[int]], Future] | None:
        """The step's grammar bitmask, filled on a worker thread while the forward runs (llguidance
        releases the GIL; the fill was ~7% of a 32-stream JSON step on 2 CPUs), the matcher of
        each sampled row it is for (a sequence's last token, or its last token and drafts, as
        ``make_batch`` lays them out; :meth:`_sample` fills anew if the rows differ) and the
        speculative runs among them (first row -> drafts: each row masked after the drafts before it)."""
        matchers: list[Any] = []
        runs: dict[int, list[int]] = {}
        for item in scheduled:
            matcher = self._by_seq[item.seq.seq_id][1].matcher
            if item.draft_token_ids:
                runs[len(matchers)] = list(item.draft_token_ids)
                matchers.extend([matcher] * (len(item.draft_token_ids) + 1))
            elif item.needs_sample:
                matchers.append(matcher)
        future = self.structured.bitmask_soon(matchers, runs)
        return None if future is None else (matchers, runs, future)

    def _record(
        self, state: RequestState, c: Completion, token_id: int, sampled: SamplerOutput, row: int
    ) -> SequenceStatus | None:
        """Account for ``token_id`` (sampled at ``row``), just appended to ``c.seq``; a finish status, if any."""
        if c.matcher is not None and not c.matcher.accept(token_id):
            logger.error("request %s: its grammar refused sampled token %d; it ends", state.request_id, token_id)
            return SequenceStatus.FINISHED_ABORTED
        status = state.record_token(
            c,
            token_id,
            sampled.logprobs[row],
            sampled.ranks[row],
            sampled.top_logprobs[row],
            capped=self.scheduler.is_capped(c.seq),
        )
        if status is None and c.matcher is not None and c.matcher.is_terminated():
            status = SequenceStatus.FINISHED_STOPPED  # the grammar is complete (its stop token ignored)
        return status

    def _propose(self) -> dict[int, list[int]]:
        """Drafts for the decoding sequences that may speculate (not those with an adapter)."""
        return self.spec.propose([seq for seq in self.scheduler.decoding() if seq.lora is None], self._matcher)

    def _matcher(self, seq: Sequence) -> Any:
        """``seq``'s grammar matcher, None when it has none."""
        return self._by_seq[seq.seq_id][1].matcher

    def _constrain(self, logits: torch.Tensor, matchers: list[Any]) -> None:
        """Mask each row of ``logits`` to what its matcher allows now (rows without one: untouched)."""
        self._apply_mask(logits, self.structured.bitmask(matchers))

    def _apply_mask(self, logits: torch.Tensor, mask: tuple[torch.Tensor, list[int]] | None) -> None:
        if mask is not None:
            with torch.inference_mode():  # the logits are the runner's inference tensor
                self.platform.kernels.apply_token_bitmask(logits, *mask)

    def _finish_step(
        self,
        sched: SchedulerOutput,
        logits: StepLogits,
        early_mask: tuple[list[Any], dict[int, list[int]], Any] | None = None,
        draft_probs: dict[int, torch.Tensor] | None = None,
    ) -> list[RequestOutput]:
        """Sample the step's rows and record them: each sequence keeps its accepted drafts (if it
        speculated) and one token more, recorded one by one, so a stop or max_tokens inside a
        run drops what follows. ``early_mask``: the matchers of the rows and their bitmask, filled
        during the forward (:meth:`_bitmask_soon`); ``draft_probs``: seq_id -> the distributions
        a draft model drew its random drafts from (verified by rejection sampling)."""
        drafts = {item.seq.seq_id: item.draft_token_ids for item in sched.scheduled if item.draft_token_ids}
        entries = [self._by_seq[seq_id] for seq_id in logits.sample_seq_ids]
        runs = [drafts.get(c.seq.seq_id, []) for _, c in entries]
        row_entries, outputs, draft_runs, row_runs = [], [], [], {}
        for entry, run in zip(entries, runs, strict=True):
            if draft_probs and entry[1].seq.seq_id in draft_probs:
                draft_runs.append(DraftRun(len(row_entries), list(run), draft_probs[entry[1].seq.seq_id]))
            if run:
                row_runs[len(row_entries)] = list(run)
            row_entries.extend([entry] * (len(run) + 1))
            outputs.extend(row_outputs(entry[1].seq.output_token_ids, run))
        sampled = self._sample(logits.sample_logits, row_entries, outputs, early_mask, draft_runs, row_runs)
        finished: list[tuple[Sequence, SequenceStatus]] = []
        row = 0
        for (state, c), run in zip(entries, runs, strict=True):
            first, row = row, row + len(run) + 1
            if c.seq.is_finished:
                continue  # aborted after it was scheduled: it got no token
            accepted = num_accepted(sampled.token_ids[first:row], run)
            if run:
                self.spec.record(c.seq.seq_id, len(run), accepted)
            for i in range(first, first + accepted + 1):
                c.seq.append_token(sampled.token_ids[i])
                status = self._record(state, c, sampled.token_ids[i], sampled, i)
                if status is not None:
                    finished.append((c.seq, status))
                    break
        self.scheduler.advance(sched)
        for seq, status in finished:
            self.scheduler.finish(seq, status)
        for seq_id, (first_pos, rows) in logits.prompt_logits.items():
            state, c = self._by_seq[seq_id]
            state.record_prompt_logprobs(c, first_pos, rows)
        return self._outputs({state.request_id: state for state, _ in entries})

    def _mark_scheduled(self, scheduled: list[ScheduledSeq]) -> None:
        now = time.time()
        for item in scheduled:
            metrics = self._by_seq[item.seq.seq_id][0].metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time = now
                metrics.time_in_queue = now - metrics.arrival_time

    def _sample(
        self,
        logits: torch.Tensor,
        entries: list[tuple[RequestState, Completion]],
        outputs: list[list[int]] | None = None,
        early_mask: tuple[list[Any], dict[int, list[int]], Any] | None = None,
        draft_runs: list[DraftRun] | None = None,
        runs: dict[int, list[int]] | None = None,
    ) -> SamplerOutput | None:
        """Sample a row per entry; ``outputs``: each row's output so far, when not its sequence's
        (a speculative run's rows count the drafts before them); ``early_mask``: see :meth:`_finish_step`;
        ``draft_runs``: draft-model runs the sampler verifies by rejection sampling; ``runs``: first
        row -> drafts of each speculative run (its rows' grammar masks follow the drafts)."""
        if not entries:
            return None
        matchers = [c.matcher for _, c in entries]
        same = early_mask is not None and list(map(id, early_mask[0])) == list(map(id, matchers))
        if same and early_mask[1] == (runs or {}):  # the same rows
            mask = early_mask[2]
        else:
            mask = self.structured.bitmask(matchers, runs)
        self._apply_mask(logits, mask)
        states = [
            _sampling_state(state, c, c.seq.output_token_ids if outputs is None else outputs[row])
            for row, (state, c) in enumerate(entries)
        ]
        return self.sampler(logits, states, draft_runs=draft_runs or ())

    def _sampling_state(self, seq: Sequence, output_token_ids: list[int]) -> SamplingState:
        """The sampling state of ``seq``'s next token after ``output_token_ids`` (for the draft model)."""
        return _sampling_state(*self._by_seq[seq.seq_id], output_token_ids)

    def _outputs(self, touched: dict[str, RequestState]) -> list[RequestOutput]:
        outputs = []
        for state in touched.values():
            state.num_cached_tokens = max(c.seq.num_cached_tokens for c in state.completions)
            if state.finished:
                state.metrics.finished_time = time.time()
                self.requests.pop(state.request_id, None)
                self._forget(state)
            outputs.append(state.to_output())
        return outputs

    def check_health(self) -> None:
        """Raise :class:`core.distributed.executor.WorkerFailed` when a worker of an idle engine died or hung."""
        self.executor.check_health()

    def shutdown(self) -> None:
        """Stop the executor's workers (worker processes or actors, when the model is split) and
        the grammar worker thread."""
        self.structured.shutdown()
        self.executor.shutdown()

    def stats(self) -> dict[str, Any]:
        """Counters for metrics: queue sizes, KV usage, prefix cache hit rate, and the
        platform's own gauges under ``"platform"``."""
        bm = self.block_manager
        return {
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            "kv_usage": bm.usage,
            "num_free_blocks": bm.num_free_blocks,
            "num_total_blocks": bm.num_total_blocks,
            "block_size": self.config.block_size,
            "kv_cache_dtype": self.config.kv_cache_dtype,
            "prefix_cache_queries": bm.prefix_cache_queries,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "num_preemptions": self.scheduler.num_preemptions,
            "spec_decode": None if self.spec is None else self.spec.stats(),
            "platform": self.platform.metrics(),
        }


def _sampling_state(state: RequestState, c: Completion, output_token_ids: list[int]) -> SamplingState:
    """What the sampler needs of completion ``c`` of ``state`` after ``output_token_ids``."""
    return SamplingState(
        params=state.params,
        prompt_token_ids=state.prompt_token_ids,
        output_token_ids=output_token_ids,
        generator=c.generator,
        stop_token_ids=sorted(state.stop_ids),
    )
