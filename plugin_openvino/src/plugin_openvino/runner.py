"""The OpenVINO runner: each step through one compiled model of the whole decoder.

:meth:`OpenVinoRunner.prepare` builds the graph from the model's description
(:mod:`plugin_openvino.graph`), compiles it once for every shape and binds core's KV cache
tensors to its cache inputs: the ``ov.Tensor`` views share their memory, and
PagedAttention writes each step's keys and values into them in place. OpenVINO lays a
block out ``[kv_heads, block_size, head_dim]`` where core's kernels read ``[block_size,
kv_heads, head_dim]``: the same bytes per block, so core's block manager (allocation,
prefix caching, copies of whole blocks) is unaffected, but the eager kernels must never
read a cache this runner wrote. So a model the graph cannot run runs eagerly from the
start, and the platform refuses LoRA (whose steps would run eagerly) in ``check_config``.
A u8 cache is in OpenVINO's own layout (:meth:`OpenVinoPlatform.kv_cache_layout`), which no
eager kernel reads: a model the graph cannot run is refused then.

The LM head runs inside the same compiled model, on the rows :func:`logit_rows` picks from the
step's query lengths (the rows core samples in a plain step or a speculative one): one infer a
step. Logits of other rows (prompt logprobs) come from a second compiled model of the LM head
alone, on the hidden states the step returned.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from plugins.config import EngineConfigView
from plugins.kernels import GGUFWeight
from plugins.runner import ModelInputs, Runner

from plugin_openvino.graph import GraphBuilder, NotBuildable
from plugin_openvino.weights import OV_TYPES, ov_tensor

logger = logging.getLogger(__name__)


class OpenVinoRunner(Runner):
    """Models that describe themselves (``model.describe``) as one compiled OpenVINO model;
    other models eagerly, with the SDK's torch kernels."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.request: Any = None
        self._compiled: Any = None
        self._keep: list[Any] = []  # every buffer the compiled model views: freed only after it
        self._lm_head: Any = None  # the infer request of the LM head's compiled model (other rows)
        # the last step's logits: the data_ptr of the hidden states it returned -> (row -> index, logits)
        self._logits: dict[int, Any] = {}
        self._dtype = torch.float32
        self._block_size = 0

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self.request = self._compiled = self._lm_head = None
        self._logits = {}
        self._block_size = config.block_size
        describe = getattr(model, "describe", None)
        try:
            if describe is None:
                raise NotBuildable(f"{type(model).__name__} does not describe itself (no describe())")
            if config.tensor_parallel_size > 1:
                raise NotBuildable(f"tensor_parallel_size={config.tensor_parallel_size} (the graph has no all-reduce)")
            self._compile(describe(kv_caches), config)
        except NotBuildable as exc:
            if kv_caches and kv_caches[0][0].dtype == torch.uint8:
                raise ValueError(
                    f"OPENVINO_CPU_KV_CACHE_PRECISION=u8: only the OpenVINO graph reads u8 blocks, and it does not "
                    f"run this model ({exc}); use f32, bf16 or f16"
                ) from None
            logger.info("%s runner: eager, the OpenVINO graph does not run this model: %s", self.platform.name, exc)

    def _compile(self, desc: Any, config: EngineConfigView) -> None:
        import openvino as ov

        plat = self.platform
        cache_dtype = desc.layers[0].k_cache.dtype
        if cache_dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.uint8):
            raise NotBuildable(f"KV cache dtype {cache_dtype}")
        kv_type = OV_TYPES[cache_dtype]()
        builder = GraphBuilder(desc, plat.env["OPENVINO_ENABLE_QUANTIZED_WEIGHTS"], kv_type, plat.q4_1_form())
        lm_weight = self._lm_head_weight(desc)
        try:
            graph = builder.build(lm_weight)
        except NotBuildable:
            if lm_weight is None:
                raise
            lm_weight, graph = None, builder.build()
        properties = plat.compile_properties(desc.dtype, kv_type.get_type_name())
        compiled = ov.Core().compile_model(graph, plat.env["OPENVINO_DEVICE"], properties)
        request = compiled.create_infer_request()
        keep: list[Any] = [desc, builder.keep]
        for i, layer in enumerate(desc.layers):
            for name, cache in ((f"key_cache.{i}", layer.k_cache), (f"value_cache.{i}", layer.v_cache)):
                port = compiled.input(name)
                shape = self._cache_shape(port, cache)
                request.set_tensor(port, ov_tensor(cache, kv_type, shape))
                keep.append(cache)
        lm_head = None if lm_weight is None else self._compile_lm_head(desc, lm_weight, builder, properties)
        self._compiled, self.request, self._keep, self._lm_head = compiled, request, keep, lm_head
        self._dtype = desc.dtype
        # torch is left the sampler's small products: its OpenMP threads, spinning after each one,
        # would take the CPUs from OpenVINO's threads (a 2-CPU decode step lost ~9 ms a step to them)
        torch.set_num_threads(1)
        logger.info("%s runner: each step as one compiled OpenVINO model on %s (KV cache %s, compute %s%s)",
                    plat.name, plat.env["OPENVINO_DEVICE"], kv_type.get_type_name(),
                    properties["INFERENCE_PRECISION_HINT"], "" if lm_head is None else ", LM head in the same graph")  # fmt: skip

    def _lm_head_weight(self, desc: Any) -> Any:
        """The model's LM head weight the graph takes (GGUF blocks kept compressed, as the
        layers' products), or None when it has none (a pipeline stage, a vocabulary split,
        another form): then core's torch LM head computes the logits."""
        weight = getattr(getattr(self.model, "lm_head", None), "weight", None)
        if desc.final_norm is None or desc.vocab_start != 0 or not isinstance(weight, (torch.Tensor, GGUFWeight)):
            return None
        return weight

    def _compile_lm_head(self, desc: Any, weight: Any, builder: GraphBuilder, properties: dict) -> Any:
        """An infer request of ``hidden [N, hidden_size] f32 -> logits [N, vocab] f32`` over the
        LM head weight ``weight``: the logits of rows the main graph did not compute."""
        import openvino as ov
        import openvino.opset13 as ops

        hidden = ops.parameter([-1, desc.hidden_size], ov.Type.f32, name="hidden")
        logits = builder.linear_product(hidden, weight)
        model = ov.Model([ops.result(logits, name="logits")], [hidden], "core_lm_head")
        compiled = ov.Core().compile_model(model, self.platform.env["OPENVINO_DEVICE"], properties)
        return compiled.create_infer_request()

    @staticmethod
    def _cache_shape(port: Any, cache: torch.Tensor) -> list[int]:
        """OpenVINO's shape of a cache input over ``cache`` (same blocks, same bytes per block;
        a u8 cache is in OpenVINO's layout already: the same shape)."""
        dims = [d.get_length() if d.is_static else cache.shape[0] for d in port.get_partial_shape()]
        if cache.dtype == torch.uint8 and dims != list(cache.shape):
            raise ValueError(f"OpenVINO wants u8 KV cache blocks of {dims[1:]}, the platform declared "
                             f"{list(cache.shape[1:])}")  # fmt: skip
        if int(np.prod(dims)) != cache.numel():
            raise NotBuildable(f"OpenVINO wants a KV cache block of {dims[1:]}, core's is {list(cache.shape[1:])}")
        return dims

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        if self.request is None:
            return super().forward(inputs)
        if inputs.lora is not None:
            raise RuntimeError("the OpenVINO runner adds no LoRA deltas (the platform refuses enable_lora)")
        meta = inputs.attn_metadata
        query_lens = np.asarray(meta.query_lens_host, dtype=np.int32)
        seq_lens = np.asarray(meta.seq_lens_host, dtype=np.int32)
        block_size = self._block_size
        num_blocks = -(-seq_lens // block_size)
        tables = meta.block_tables.cpu().numpy()
        block_indices = np.concatenate([row[:n] for row, n in zip(tables, num_blocks, strict=True)])
        request = self.request
        _write(request, "input_ids", inputs.input_ids.numpy())
        _write(request, "positions", inputs.positions.numpy())
        _write(request, "past_lens", seq_lens - query_lens)
        _write(request, "subsequence_begins", np.concatenate([[0], np.cumsum(query_lens)]))
        _write(request, "block_indices", block_indices)
        _write(request, "block_indices_begins", np.concatenate([[0], np.cumsum(num_blocks)]))
        _write(request, "max_context_len", seq_lens.max())
        rows = None
        if self._lm_head is not None:
            rows = logit_rows(query_lens, seq_lens)
            _write(request, "logit_rows", rows)
        request.infer()
        hidden = torch.from_numpy(request.get_output_tensor(0).data.copy())
        # a bfloat16 output reads as float16 in numpy (which has no bfloat16): the same bits
        hidden = hidden.view(torch.bfloat16) if self._dtype == torch.bfloat16 else hidden.to(self._dtype)
        if rows is not None:
            logits = torch.from_numpy(request.get_output_tensor(1).data.copy())
            self._logits = {hidden.data_ptr(): ({row: i for i, row in enumerate(rows.tolist())}, logits)}
        return hidden

    def compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """float32 logits: those the step's infer computed (:func:`logit_rows`), else through the
        LM head's compiled model (its GGUF blocks stay compressed: the torch kernels would
        dequantize them on every call)."""
        if self._lm_head is None:
            return super().compute_logits(hidden, rows)
        index, logits = self._logits.get(hidden.data_ptr(), ({}, None))
        if logits is not None and all(row in index for row in rows):
            if rows == list(index):  # every row it computed, in order: no copy
                return logits
            return logits.index_select(0, torch.tensor([index[row] for row in rows], dtype=torch.long))
        picked = hidden.index_select(0, torch.tensor(rows, dtype=torch.long)).float().contiguous()
        _write(self._lm_head, "hidden", picked.numpy())
        self._lm_head.infer()
        return torch.from_numpy(self._lm_head.get_output_tensor(0).data.copy())


#: a sequence continuing its context with at most this many tokens has logits for every row (a
#: speculative step's last token and drafts); any other sequence for its last row only
SPECULATIVE_ROWS = 8


def logit_rows(query_lens: np.ndarray, seq_lens: np.ndarray) -> np.ndarray:
    """The rows of a step whose logits the graph computes: every row of a sequence that continues
    its context (past tokens in the cache) by at most :data:`SPECULATIVE_ROWS` tokens, which
    covers a speculative step's verified drafts; the last row of every other sequence (a prompt's
    chunk), the only one core samples. int32, ascending."""
    ends = np.cumsum(query_lens, dtype=np.int32)
    speculative = (query_lens <= SPECULATIVE_ROWS) & (seq_lens > query_lens)
    counts = np.where(speculative, query_lens, np.minimum(query_lens, 1))
    if (counts == 1).all():  # a decode step, or a prompt's chunk each
        return ends - 1
    firsts = np.cumsum(counts) - counts  # each sequence's first entry in the result
    offsets = np.arange(counts.sum(), dtype=np.int32) - np.repeat(firsts, counts)
    return (np.repeat(ends - counts, counts) + offsets).astype(np.int32)


def _write(request: Any, name: str, array: Any) -> None:
    """Copy ``array`` (converted to the input's element type) into the infer request's own tensor
    of input ``name``, resized to its shape: a fraction of the cost of a new ``ov.Tensor`` and
    ``set_tensor`` each step."""
    tensor = request.get_tensor(name)
    tensor.shape = np.shape(array)
    tensor.data[...] = array
