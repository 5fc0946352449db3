"""The pooling engine: inputs in, one vector (or class probabilities) each out, no KV cache kept.

A step reads ``schedule -> encode -> pool -> outputs``: waiting requests are taken oldest first
while their tokens fit the step's budget (``max_num_batched_tokens``, by default at least
:data:`POOLING_STEP_TOKENS`; a longer input runs alone) and ``max_num_seqs``; the model
encodes them as one flattened batch; each sequence's rows are
pooled as the model's :class:`~core.pooling.config.PoolerConfig` says and finished as its request
asks (cut to ``dimensions``, normalized). Every request finishes in the step that runs it. The
engine has :class:`core.engine.LLMEngine`'s face (add, step, abort, stats), so the offline API and
the server's :class:`core.async_engine.AsyncEngine` drive it the same way.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from core.config import EngineConfig
from core.distributed.worker import Worker
from core.models.bert import BertModel
from core.pooling.config import read_pooler_config
from core.pooling.inputs import encode_pair, encode_text
from core.pooling.params import PoolingOutput, PoolingParams, PoolingRequestOutput
from core.pooling.pooler import check_dimensions, finish, pool
from core.pooling.runner import DecoderRunner, EncoderRunner
from core.resolve import resolve_engine

logger = logging.getLogger(__name__)

#: tokens a pooling step takes at least when the user set no ``max_num_batched_tokens``
POOLING_STEP_TOKENS = 2048


@dataclass(eq=False)
class PoolingRequest:
    request_id: str
    prompt_token_ids: list[int]
    token_type_ids: list[int]
    params: PoolingParams
    arrival_time: float


class PoolingEngine:
    """Owns a pooling model on one platform (``--runner pooling``); one rank, no tensor parallelism."""

    def __init__(self, config: EngineConfig, skip_tokenizer_init: bool = False, data_parallel_rank: int = 0) -> None:
        started = time.perf_counter()
        resolved = resolve_engine(config)
        if resolved.config.world_size != 1:
            raise ValueError(
                "the pooling runner runs a model on one rank: tensor_parallel_size and pipeline_parallel_size must be 1"
            )
        self.platform = resolved.platform
        view = dataclasses.replace(resolved.config, rank=data_parallel_rank, local_rank=data_parallel_rank)
        self.worker = Worker(self.platform, view, resolved.model, load_tokenizer=not skip_tokenizer_init)
        self.loaded = self.worker.loaded
        self.tokenizer = self.loaded.tokenizer
        model = self.loaded.model
        self.is_encoder = isinstance(model, BertModel)
        self.pooler = read_pooler_config(resolved.model.path, self.loaded.hf_config, self.is_encoder)
        max_len = view.max_model_len
        if config.max_model_len is None and self.pooler.max_seq_length:  # sentence-transformers' own limit
            max_len = min(max_len, self.pooler.max_seq_length)
        # a platform's default budget bounds the prefill a decoding request waits behind; pooling steps
        # delay no decoding, so they take the SDK's default when the platform's is smaller
        budget = config.max_num_batched_tokens or max(view.max_num_batched_tokens, POOLING_STEP_TOKENS)
        self.config = dataclasses.replace(view, max_model_len=max_len, max_num_batched_tokens=budget)
        if self.is_encoder:
            self.runner: EncoderRunner | DecoderRunner = EncoderRunner(self.platform, model)
        else:
            self.runner = DecoderRunner(self.platform, self.worker.runner, self.config, max(budget, max_len))
        self.requests: dict[str, PoolingRequest] = {}
        self.waiting: collections.deque[PoolingRequest] = collections.deque()
        logger.info(
            "pooling engine ready in %.1fs: device=%s model=%s (%s pooling%s, max_model_len=%d, %d tokens a step) dtype=%s",
            time.perf_counter() - started,
            self.platform.name,
            self.loaded.name,
            self.pooler.pooling_type,
            ", normalized" if self.pooler.normalize else "",
            max_len,
            budget,
            self.config.dtype,
        )

    @property
    def hidden_size(self) -> int:
        return self.loaded.hf_config.hidden_size

    @property
    def can_classify(self) -> bool:
        """The model has a classification head (``*ForSequenceClassification``)."""
        return self.is_encoder and self.loaded.model.classifier is not None

    @property
    def is_cross_encoder(self) -> bool:
        """The model scores text pairs with a one-label head (its scores are not embeddings' cosines)."""
        return self.can_classify and self.loaded.hf_config.num_labels == 1

    # -- requests ------------------------------------------------------------------------
    def tokenize(self, prompt: str, max_tokens: int | None = None) -> list[int]:
        """Token ids of ``prompt``; with ``max_tokens``, at most that many (:func:`~core.pooling.inputs.encode_text`)."""
        if self.tokenizer is None:
            raise ValueError("this engine was started without a tokenizer: pass prompt_token_ids")
        return encode_text(self.tokenizer, prompt, max_tokens)

    def tokenize_pair(self, first: str, second: str, max_tokens: int | None = None) -> list[int]:
        """Token ids of a text pair for a cross-encoder (:func:`~core.pooling.inputs.encode_pair`)."""
        if self.tokenizer is None:
            raise ValueError("this engine was started without a tokenizer: cross-encoder pairs need one")
        return encode_pair(self.tokenizer, first, second, max_tokens)

    def add_request(
        self,
        request_id: str,
        prompt: str | None = None,
        params: Any = None,
        prompt_token_ids: list[int] | None = None,
        arrival_time: float | None = None,
        priority: int = 0,
        lora_request: Any = None,
    ) -> None:
        """Queue a pooling request (``priority`` is ignored: requests run in arrival order; LoRA
        adapters are refused). Raises ValueError (naming the problem) when it cannot run."""
        params = PoolingParams() if params is None else params
        if not isinstance(params, PoolingParams):
            raise ValueError(
                f"model {self.loaded.name} runs with the pooling runner (--runner pooling): it embeds, scores and "
                "classifies, it does not generate text"
            )
        if lora_request is not None:
            raise ValueError("LoRA adapters apply to the generate runner, not to pooling models")
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        keep = params.truncate_prompt_tokens
        keep = self.config.max_model_len if keep == -1 else keep
        if prompt_token_ids is None:
            if prompt is None:
                raise ValueError("a request needs a prompt or prompt_token_ids")
            prompt_token_ids = self.tokenize(prompt, keep)
        ids = list(prompt_token_ids)[-keep:] if keep else list(prompt_token_ids)
        if not ids:
            raise ValueError("the input is empty: it needs at least one token")
        if len(ids) > self.config.max_model_len:
            raise ValueError(
                f"the input has {len(ids)} tokens; this model takes at most {self.config.max_model_len}: "
                "shorten it or set truncate_prompt_tokens"
            )
        check_dimensions(params, self.pooler, self.hidden_size)
        if params.task == "classify" and not self.can_classify:
            raise ValueError(f"model {self.loaded.name} has no classification head")
        types = [0] * len(ids)
        if params.task == "score":
            if not self.is_cross_encoder:
                raise ValueError(f"model {self.loaded.name} is not a cross-encoder (a one-label classification head)")
            sep = self.loaded.hf_config.sep_token_id if self.tokenizer is None else self.tokenizer.sep_token_id
            if sep not in ids:
                raise ValueError("a cross-encoder's input is a pair: [CLS] first [SEP] second [SEP]")
            first_len = ids.index(sep) + 1
            types = [0] * first_len + [1] * (len(ids) - first_len)
        arrival = time.time() if arrival_time is None else arrival_time
        request = PoolingRequest(request_id, ids, types, params, arrival)
        self.requests[request_id] = request
        self.waiting.append(request)

    def abort_request(self, request_id: str) -> PoolingRequestOutput | None:
        """Drop a request; its final output (marked aborted, no data), None if unknown."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        if request in self.waiting:  # else it was in a step that failed
            self.waiting.remove(request)
        empty = PoolingOutput(torch.empty(0))
        return PoolingRequestOutput(request_id, request.prompt_token_ids, empty, is_aborted=True)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- one step --------------------------------------------------------------------------
    def step(self) -> list[PoolingRequestOutput]:
        """Encode the next batch of waiting requests; their outputs (every one finished)."""
        batch = self._schedule()
        if not batch:
            return []
        lens = [len(r.prompt_token_ids) for r in batch]
        hidden = self.runner.hidden_states([r.prompt_token_ids for r in batch], [r.token_type_ids for r in batch])
        with self.platform.runner.grad_mode():
            pooled = pool(hidden, lens, self.pooler.pooling_type).cpu()
            if any(r.params.task != "embed" for r in batch):
                firsts = torch.tensor([0, *lens[:-1]], device=hidden.device).cumsum(0)
                logits = self.loaded.model.classify(hidden[firsts]).cpu()
                # one label: a probability of its own (sentence-transformers' CrossEncoder, vLLM)
                probs = torch.sigmoid(logits) if logits.shape[1] == 1 else torch.softmax(logits, dim=-1)
        outputs = []
        for i, request in enumerate(batch):
            del self.requests[request.request_id]
            embed = request.params.task == "embed"
            data = finish(pooled[i], request.params, self.pooler) if embed else probs[i]
            outputs.append(PoolingRequestOutput(request.request_id, request.prompt_token_ids, PoolingOutput(data)))
        return outputs

    def _schedule(self) -> list[PoolingRequest]:
        """The oldest waiting requests whose tokens fit the budget (at least one)."""
        batch: list[PoolingRequest] = []
        num_tokens = 0
        while self.waiting and len(batch) < self.config.max_num_seqs:
            n = len(self.waiting[0].prompt_token_ids)
            if batch and num_tokens + n > self.config.max_num_batched_tokens:
                break
            batch.append(self.waiting.popleft())
            num_tokens += n
        return batch

    # -- lifecycle ---------------------------------------------------------------------------
    def check_health(self) -> None:
        """Nothing to watch: the model runs in this process."""

    def shutdown(self) -> None:
        self.worker.close()

    def stats(self) -> dict[str, Any]:
        """The counters the server's metrics read (no KV cache: its gauges are 0)."""
        return {
            "num_running": 0,
            "num_waiting": len(self.waiting),
            "kv_usage": 0.0,
            "num_free_blocks": 0,
            "num_total_blocks": 0,
            "block_size": self.config.block_size,
            "kv_cache_dtype": self.config.kv_cache_dtype,
            "prefix_cache_queries": 0,
            "prefix_cache_hits": 0,
            "num_preemptions": 0,
            "platform": self.platform.metrics(),
        }
