"""The synchronous engine: ``add_request`` then ``step`` until done.

A step reads ``schedule -> run -> sample -> postprocess``: the scheduler picks tokens,
the model runner runs them on the platform, the sampler picks next tokens, and each
request's state turns them into text and outputs.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import logging
import time
from typing import Any

import torch
from plugins import Platform

from core.block_manager import BlockManager
from core.config import EngineConfig
from core.detokenizer import IncrementalDetokenizer, StopChecker
from core.discovery import discover, select_platform
from core.distributed.executor import make_executor
from core.distributed.worker import resolve_max_model_len
from core.outputs import RequestMetrics, RequestOutput
from core.request_state import Completion, RequestState
from core.sampler import Sampler, SamplingState, make_generator, prompt_logprobs_for
from core.sampling_params import SamplingParams
from core.scheduler import Scheduler
from core.sequence import Sequence

logger = logging.getLogger(__name__)
# engines gc.freeze() what they keep (LLMEngine.__init__); at exit it goes back to the
# collector, so the interpreter's last collection frees it (no leak reports at exit)
atexit.register(gc.unfreeze)


def resolve_platform(device: str | Platform) -> Platform:
    """A platform instance for ``device``: a Platform (used as is) or a name / ``auto``."""
    if isinstance(device, Platform):
        return device
    if isinstance(device, type) and issubclass(device, Platform):
        return device()
    return select_platform(device, discover())


class LLMEngine:
    """Owns the model, KV cache, scheduler and sampler of one platform."""

    def __init__(
        self, config: EngineConfig, platform: Platform | str | None = None, skip_tokenizer_init: bool = False
    ) -> None:
        config.validate()
        self.config = config
        self.platform = resolve_platform(platform if platform is not None else config.device)
        config.apply_overrides(self.platform.check_config(config), f"platform {self.platform.name}")
        self.dtype = self._resolve_dtype()
        torch.manual_seed(config.seed)
        started = time.perf_counter()
        # the model runs in the executor's workers: here for one rank, in worker processes when split
        self.executor = make_executor(self.platform, config, load_tokenizer=not skip_tokenizer_init)
        self.loaded = self.executor.loaded
        self.tokenizer = self.loaded.tokenizer
        config.max_model_len = resolve_max_model_len(config.max_model_len, self.loaded.max_model_len)
        self.kv_plan = self.executor.kv_plan
        self.block_manager = BlockManager(self.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
            max_model_len=config.max_model_len,
            enable_chunked_prefill=config.enable_chunked_prefill,
        )
        self.sampler = Sampler()
        self.requests: dict[str, RequestState] = {}
        self._seq_ids = itertools.count()
        self._by_seq: dict[int, tuple[RequestState, Completion]] = {}
        tokens = self.kv_plan.num_blocks * config.block_size
        # what lives as long as the engine (model, tokenizer tables: ~10^6 objects) leaves the
        # collector's generations, so the full collections that generation triggers do not
        # walk it again and again (gc was ~1.5% of a batched run's CPU time before)
        gc.collect()
        gc.freeze()
        logger.info(
            "engine ready in %.1fs: device=%s model=%s dtype=%s quantization=%s; KV cache %d blocks = %d tokens, "
            "max concurrency at max_model_len=%d: %.1fx",
            time.perf_counter() - started,
            self.platform.name,
            self.loaded.name,
            config.dtype,
            config.quantization,
            self.kv_plan.num_blocks,
            tokens,
            config.max_model_len,
            tokens / config.max_model_len,
        )

    def _resolve_dtype(self) -> torch.dtype:
        supported = self.platform.supported_dtypes
        name = supported[0] if self.config.dtype == "auto" else self.config.dtype
        if name not in supported:
            raise ValueError(
                f"dtype {name!r} is not supported on {self.platform.name}; supported: {', '.join(supported)}"
            )
        self.config.dtype = name
        return getattr(torch, name)

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
            raise ValueError(f"model {self.loaded.name} has no chat template; pass chat_template")
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
    ) -> None:
        """Queue a request. Raises ValueError (naming the problem) when it can never run."""
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        params = params or SamplingParams()
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("a request needs a prompt or prompt_token_ids")
            prompt_token_ids = self.tokenize(prompt)
        prompt_token_ids = list(prompt_token_ids)
        if not prompt_token_ids:
            raise ValueError("the prompt is empty: it must hold at least one token")
        vocab = self.loaded.hf_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab}), the vocabulary of the model")
        max_len = self.config.max_model_len
        max_tokens = params.max_tokens if params.max_tokens is not None else max_len - len(prompt_token_ids)
        if len(prompt_token_ids) + max(max_tokens, 1) > max_len:
            raise ValueError(
                f"This model's maximum context length is {max_len} tokens. However, you requested "
                f"{len(prompt_token_ids) + max_tokens} tokens ({len(prompt_token_ids)} in the prompt, {max_tokens} "
                "for the completion). Please reduce the prompt or max_tokens."
            )
        if not self.scheduler.can_ever_fit(len(prompt_token_ids) + max_tokens):
            raise ValueError(
                f"request needs {len(prompt_token_ids) + max_tokens} tokens of KV cache; the whole cache holds "
                f"{self.kv_plan.num_blocks * self.config.block_size}"
            )
        params = params.clone(max_tokens=max_tokens)
        arrival = arrival_time if arrival_time is not None else time.time()
        completions = []
        for index in range(params.n):
            seq = Sequence(
                next(self._seq_ids),
                request_id,
                prompt_token_ids,
                params,
                arrival,
                priority,
                skip_prefix_cache=params.prompt_logprobs is not None,  # every prompt position must be computed
            )
            seed = None if params.seed is None else params.seed + index
            completions.append(
                Completion(
                    seq=seq,
                    detokenizer=self._detokenizer(prompt_token_ids, params),
                    stop_checker=StopChecker(params.stop, params.include_stop_str_in_output, params.min_tokens)
                    if params.stop
                    else None,
                    generator=None if seed is None else make_generator(seed, self.platform.torch_device()),
                )
            )
        state = RequestState(
            request_id=request_id,
            prompt=prompt,
            prompt_token_ids=prompt_token_ids,
            params=params,
            completions=completions,
            stop_ids=frozenset(params.stop_ids_for(self.loaded.eos_token_ids)),
            tokenizer=self.tokenizer,
            metrics=RequestMetrics(arrival_time=arrival),
            prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
        )
        self.requests[request_id] = state
        for c in completions:
            self._by_seq[c.seq.seq_id] = (state, c)
            self.scheduler.add(c.seq)

    def _detokenizer(self, prompt_token_ids: list[int], params: SamplingParams) -> IncrementalDetokenizer | None:
        if self.tokenizer is None:
            return None
        return IncrementalDetokenizer(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )

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
        sched = self.scheduler.schedule()
        if sched.is_empty:
            return []
        now = time.time()
        for item in sched.scheduled:
            state, _ = self._by_seq[item.seq.seq_id]
            if state.metrics.first_scheduled_time is None:
                state.metrics.first_scheduled_time = now
                state.metrics.time_in_queue = now - state.metrics.arrival_time
        logits = self.executor.execute(sched.scheduled)
        self._record_prompt_logprobs(logits.prompt_logits)
        entries = [self._by_seq[seq_id] for seq_id in logits.sample_seq_ids]
        states = [
            SamplingState(
                params=state.params,
                prompt_token_ids=state.prompt_token_ids,
                output_token_ids=c.seq.output_token_ids,
                generator=c.generator,
                stop_token_ids=sorted(state.stop_ids),
            )
            for state, c in entries
        ]
        sampled = self.sampler(logits.sample_logits, states) if states else None
        token_ids = dict(zip(logits.sample_seq_ids, sampled.token_ids, strict=False)) if sampled else {}
        self.scheduler.update(sched, token_ids)

        touched: dict[str, RequestState] = {}
        for row, (state, c) in enumerate(entries):
            seq = c.seq
            touched[state.request_id] = state
            if seq.is_finished and seq.finish_reason != "length":
                continue
            status = state.record_token(
                c, token_ids[seq.seq_id], sampled.logprobs[row], sampled.ranks[row], sampled.top_logprobs[row]
            )
            if status is not None:
                self.scheduler.finish(seq, status)
        outputs = []
        for state in touched.values():
            state.num_cached_tokens = max(c.seq.num_cached_tokens for c in state.completions)
            if state.finished:
                state.metrics.finished_time = time.time()
                self.requests.pop(state.request_id, None)
                self._forget(state)
            outputs.append(state.to_output())
        return outputs

    def _record_prompt_logprobs(self, prompt_logits: dict[int, tuple[int, torch.Tensor]]) -> None:
        for seq_id, (first_pos, rows) in prompt_logits.items():
            state, c = self._by_seq[seq_id]
            if c is not state.completions[0] or state.prompt_logprobs is None:
                continue  # siblings share the prompt: record it once
            if len(state.prompt_logprobs) != first_pos + 1:
                continue  # recomputed after preemption: already recorded
            targets = c.seq.prompt_token_ids[first_pos + 1 : first_pos + 1 + rows.shape[0]]
            state.prompt_logprobs.extend(
                prompt_logprobs_for(rows, targets, state.params.prompt_logprobs, decode=state.decode_token)
            )

    def shutdown(self) -> None:
        """Stop the executor's workers (worker processes or actors, when the model is split)."""
        self.executor.shutdown()

    def stats(self) -> dict[str, Any]:
        """Counters for metrics: queue sizes, KV usage, prefix cache hit rate."""
        bm = self.block_manager
        return {
            "num_running": self.scheduler.num_running,
            "num_waiting": self.scheduler.num_waiting,
            "kv_usage": bm.usage,
            "num_free_blocks": bm.num_free_blocks,
            "num_total_blocks": bm.num_total_blocks,
            "prefix_cache_queries": bm.prefix_cache_queries,
            "prefix_cache_hits": bm.prefix_cache_hits,
            "num_preemptions": self.scheduler.num_preemptions,
        }
