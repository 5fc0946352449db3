"""The CPU plugins' runner: forward passes of Llama-family models as one native call a step.

The eager forward of core's Llama decoder (also Qwen2 and Mistral) calls ~12 kernels a
layer from Python: at batch 1 on a 135M model their overhead takes as long as the
kernels themselves. :class:`FusedDecoder` hands the same kernels, in the same order, to
``ck_<isa>_decode`` (native/src/decode.cpp) with the weights and caches described once
(from the model's :class:`plugins.model.ModelDescription`), so a step costs one Python
call and gives the eager result exactly. It is CPU graph capture in all but name,
without padding or fixed batch sizes: built in :meth:`NativeCpuRunner.prepare`, used for
every step; models that do not describe themselves, or that it cannot run, run eagerly, as
and steps with LoRA adapter rows add their deltas natively (native/src/lora.cpp) after each
adapted projection, within rounding of the eager sums.
"""

from __future__ import annotations

import ctypes
import logging
from ctypes import POINTER, Structure, c_float, c_int, c_long, c_void_p
from typing import Any

import torch
from plugins.config import EngineConfigView
from plugins.cpu_native.kernels import cache_code
from plugins.cpu_native.library import F32W
from plugins.cpu_native.linear import NATIVE_DTYPES, QuantizedWeight, native_bias
from plugins.cpu_native.moe import ExpertsLayout, NativeExperts
from plugins.cpu_native.shm import SharedMemoryCommunicator
from plugins.lora import LoRAWeights
from plugins.model import LinearWeights, ModelDescription, MoEWeights
from plugins.runner import ModelInputs, Runner

logger = logging.getLogger(__name__)


class _LoRAStep(Structure):
    _fields_ = [("row_slots", c_void_p), ("num_rows", c_long)]


class _LoRA(Structure):
    _fields_ = [
        ("a", c_void_p), ("b", c_void_p * 3), ("n", c_long * 3), ("num_parts", c_long), ("rank", c_long),
        ("num_slots", c_long), ("step", POINTER(_LoRAStep)),
    ]  # fmt: skip


class _Linear(Structure):
    _fields_ = [
        ("w", c_void_p), ("scales", c_void_p), ("bias", c_void_p), ("n", c_long), ("k", c_long),
        ("qt", c_int), ("bias_dtype", c_int), ("lora", POINTER(_LoRA)), ("bf16w", c_void_p),
    ]  # fmt: skip


class _MoE(Structure):
    _fields_ = [("router", _Linear), ("experts", POINTER(ExpertsLayout)), ("top_k", c_long), ("renormalize", c_int)]


class _Layer(Structure):
    _fields_ = [
        ("input_norm", c_void_p), ("post_norm", c_void_p), ("qkv", _Linear), ("o", _Linear),
        ("gate_up", _Linear), ("down", _Linear), ("k_cache", c_void_p), ("v_cache", c_void_p),
        ("kv_scale", c_void_p), ("q_norm", c_void_p), ("k_norm", c_void_p), ("moe", POINTER(_MoE)),
    ]  # fmt: skip


class _Decoder(Structure):
    _fields_ = [
        ("layers", POINTER(_Layer)), ("num_layers", c_long), ("hidden", c_long), ("heads", c_long),
        ("kv_heads", c_long), ("head_dim", c_long), ("inter", c_long), ("vocab", c_long),
        ("block_size", c_long), ("num_slots", c_long), ("embed", c_void_p), ("final_norm", c_void_p),
        ("cos_sin", c_void_p), ("eps", c_float), ("scale", c_float), ("dtype", c_int), ("norm_dtype", c_int),
        ("cos_sin_dtype", c_int), ("cache_dtype", c_int), ("window", c_long), ("vocab_start", c_long),
        ("vocab_total", c_long), ("all_reduce", c_void_p), ("comm", c_void_p),
    ]  # fmt: skip


class _Step(Structure):
    _fields_ = [
        ("ids", c_void_p), ("positions", c_void_p), ("slots", c_void_p), ("starts", c_void_p),
        ("seq_lens", c_void_p), ("tables", c_void_p), ("table_stride", c_long), ("tokens", c_long),
        ("num_seqs", c_long), ("out", c_void_p), ("intermediate", c_void_p), ("out_intermediate", c_int),
    ]  # fmt: skip


class NotFusable(Exception):
    """The model (or its weights, caches, dtypes) is not one the native decoder runs."""


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise NotFusable(why)


def _dense(t: Any, dtype: torch.dtype, what: str) -> int:
    _need(isinstance(t, torch.Tensor) and t.dtype == dtype and t.is_contiguous(), f"{what} is not a contiguous {dtype}")
    return t.data_ptr()


def _linear(linear: LinearWeights, what: str) -> _Linear:
    """The native description of a prepared linear."""
    w, bias = linear.weight, linear.bias
    if isinstance(w, QuantizedWeight):
        _need(w.perm is None, f"{what} weight gathers its input first (act-order)")
        _need(w.fp8_activations is None, f"{what} rounds its activations to FP8 first")
        code, ptr, scales, n, k = w.call_code, w.data_ptr, w.scales_ptr, w.out_features, w.in_features
    else:
        _need(isinstance(w, torch.Tensor) and w.dim() == 2, f"{what} weight is not a matrix")
        ptr, (n, k) = _dense(w, torch.float32, f"{what} weight"), w.shape
        code, scales = F32W, 0
    _need(k % 32 == 0, f"{what} has {k} input features, not a multiple of 32")
    bias_arg = native_bias(bias)
    _need(bias_arg is not None, f"{what} bias is not contiguous float32/bfloat16")
    bias_ptr, bias_dt = bias_arg
    return _Linear(ptr, scales or None, bias_ptr, n, k, code, bias_dt)


def _lora(lora: LoRAWeights, linear: LinearWeights, dtype: torch.dtype, max_rank: int, step: _LoRAStep,
          what: str) -> _LoRA:  # fmt: skip
    """The native description of a linear's adapter slots (pointers to the tensors core updates in place)."""
    a, b, rank = lora.a, lora.b, lora.rank
    _need(1 <= len(b) <= 3 and rank <= max_rank, f"{what} LoRA: {len(b)} parts of rank {rank} (native: 1-3, <= "
          f"{max_rank})")  # fmt: skip
    sizes = [part.shape[1] for part in b]
    _need(tuple(a.shape[1:]) == (len(b) * rank, linear.in_features) and sum(sizes) == linear.out_features,
          f"{what} LoRA shapes")  # fmt: skip
    parts = [_dense(part, dtype, f"{what} LoRA B") for part in b]
    return _LoRA(_dense(a, dtype, f"{what} LoRA A"), (c_void_p * 3)(*parts), (c_long * 3)(*sizes), len(b), rank,
                 a.shape[0], ctypes.pointer(step))  # fmt: skip


def _moe(moe: MoEWeights, hidden: int, what: str) -> _MoE:
    """The native description of a mixture-of-experts MLP (its experts packed by ``prepare_experts``)."""
    experts = moe.experts
    _need(isinstance(experts, NativeExperts), f"{what} experts are not packed for the native kernel "
          "(projection inputs not a multiple of 32, or a format it does not take)")  # fmt: skip
    _need(moe.router.lora is None, f"{what} router has LoRA adapters")
    _need((moe.router.in_features, moe.router.out_features) == (hidden, moe.num_experts), f"{what} router shape")
    _need((experts.hidden_size, experts.num_experts) == (hidden, moe.num_experts), f"{what} experts' shape")
    _need(0 < moe.top_k <= moe.num_experts, f"{what} routes to {moe.top_k} of {moe.num_experts} experts")
    return _MoE(_linear(moe.router, f"{what} router"), ctypes.pointer(experts.native), moe.top_k, moe.renormalize)


def _native_all_reduce(comm: Any | None) -> tuple[int | None, int | None]:
    """The native all-reduce of a tensor-parallel model's communicator and its handle, (None, None) unsplit."""
    if comm is None:
        return None, None
    native = comm.native_all_reduce if isinstance(comm, SharedMemoryCommunicator) else None
    _need(native is not None, f"the ranks' communicator ({type(comm).__name__}) has no native all-reduce")
    return native


class FusedDecoder:
    """One native call per forward pass of a Llama-family model (any batch of a step),
    from the model's explicit description (:class:`plugins.model.ModelDescription`): q/k head
    norms (Qwen3) and mixture-of-experts layers (native/src/moe.cpp) included, and a pipeline
    stage's layers (a description without an embedding takes the previous stage's output, one
    without a final norm returns its hidden states and residual: :class:`plugins.runner.ModelInputs`).

    :raises NotFusable: a weight format, a dtype, a dim or the cache layout is one the
        native decoder does not run (the caller then runs eagerly).
    """

    def __init__(self, desc: ModelDescription, kernels: Any) -> None:
        layers, dtype = desc.layers, desc.dtype
        _need(len(layers) > 0, "no layers")
        _need(dtype in NATIVE_DTYPES, f"dtype {dtype} (native: float32, bfloat16)")
        heads, kv_heads, d = desc.num_heads, desc.num_kv_heads, desc.head_dim
        _need(heads % kv_heads == 0 and heads // kv_heads <= kernels.lib.max_group, "query heads per KV head")
        _need(d <= kernels.lib.max_head and d % 2 == 0, f"head size {d}")
        # a pipeline stage: the first embeds (else takes the previous stage's output), the last normalizes
        self.first, self.last = desc.embedding is not None, desc.final_norm is not None
        norm_w, cos_sin = desc.final_norm if self.last else layers[0].input_norm, desc.cos_sin
        _need(norm_w.dtype in NATIVE_DTYPES, "RMSNorm weights are not float32/bfloat16")
        _need(cos_sin.dtype in NATIVE_DTYPES and cos_sin.shape[-1] == d, "rotary cache")
        k_cache0 = layers[0].k_cache
        cache_dtype = k_cache0.dtype
        _need(cache_code(dtype, cache_dtype) is not None, f"KV cache dtype {cache_dtype} under {dtype}")
        # an E4M3 cache's scales are set by the first (eager) write: until then, steps run eagerly
        self.kv_scales = [layer.kv_scale for layer in layers if layer.kv_scale is not None]
        _need(len(self.kv_scales) in (0, len(layers)), "a kv_scale on every layer or none")
        hidden, inter = desc.hidden_size, desc.intermediate_size
        q_size, kv_size = heads * d, kv_heads * d
        # (in, out) of each projection: the native decoder sizes its buffers from these
        shapes = {"qkv": (hidden, q_size + 2 * kv_size), "o": (q_size, hidden), "gate_up": (hidden, 2 * inter),
                  "down": (inter, hidden)}  # fmt: skip
        self._layers = (_Layer * len(layers))()
        self._lora_step = _LoRAStep()  # the step's rows -> slots, set by each call with adapter rows
        self._loras: list[_LoRA] = []  # kept alive: the layers point at them
        self._moes: list[_MoE] = []  # likewise
        for i, layer in enumerate(layers):
            k_cache, v_cache = layer.k_cache, layer.v_cache
            _need(k_cache.shape == k_cache0.shape == v_cache.shape, "same KV cache shape per layer")
            _need(tuple(k_cache.shape[2:]) == (kv_heads, d), "KV cache layout [blocks, block_size, kv_heads, d]")
            entry = self._layers[i]
            entry.input_norm = _dense(layer.input_norm, norm_w.dtype, f"layer {i} input norm")
            entry.post_norm = _dense(layer.post_attention_norm, norm_w.dtype, f"layer {i} post norm")
            if layer.q_norm is not None or layer.k_norm is not None:
                _need(all(w is not None and w.shape == (d,) for w in (layer.q_norm, layer.k_norm)),
                      f"layer {i} q/k norms: a [{d}] weight each")  # fmt: skip
                entry.q_norm = _dense(layer.q_norm, norm_w.dtype, f"layer {i} q norm")
                entry.k_norm = _dense(layer.k_norm, norm_w.dtype, f"layer {i} k norm")
            if layer.moe is not None:
                self._moes.append(_moe(layer.moe, hidden, f"layer {i}"))
                entry.moe = ctypes.pointer(self._moes[-1])
            for name in ("qkv", "o") if layer.moe is not None else ("qkv", "o", "gate_up", "down"):
                linear = getattr(layer, name)
                _need((linear.in_features, linear.out_features) == shapes[name], f"layer {i} {name} shape")
                native = _linear(linear, f"layer {i} {name}")
                if dtype == torch.bfloat16 and isinstance(linear.weight, QuantizedWeight):
                    panels = kernels.bf16_panels(linear.weight)  # made here, once, as eager would make them
                    native.bf16w = None if panels is None else panels.data_ptr
                if linear.lora is not None:
                    self._loras.append(_lora(linear.lora, linear, dtype, kernels.lib.lora_max_rank(), self._lora_step,
                                             f"layer {i} {name}"))  # fmt: skip
                    native.lora = ctypes.pointer(self._loras[-1])
                setattr(entry, name, native)
            entry.k_cache = _dense(k_cache, cache_dtype, f"layer {i} K cache")
            entry.v_cache = _dense(v_cache, cache_dtype, f"layer {i} V cache")
            if layer.kv_scale is not None:
                entry.kv_scale = _dense(layer.kv_scale, torch.float32, f"layer {i} kv_scale")
        all_reduce, comm = _native_all_reduce(desc.comm)
        embed = _dense(desc.embedding, dtype, "embedding") if self.first else None
        vocab = desc.embedding.shape[0] if self.first else 0
        final_norm = _dense(norm_w, norm_w.dtype, "final norm") if self.last else None
        self._decoder = _Decoder(
            self._layers, len(layers), hidden, heads, kv_heads, d, inter, vocab,
            k_cache0.shape[1], k_cache0.shape[0] * k_cache0.shape[1], embed,
            final_norm, _dense(cos_sin, cos_sin.dtype, "rotary cache"),
            desc.rms_norm_eps, desc.attn_scale, NATIVE_DTYPES[dtype], NATIVE_DTYPES[norm_w.dtype],
            NATIVE_DTYPES[cos_sin.dtype], cache_code(dtype, cache_dtype), desc.sliding_window or 0,
            desc.vocab_start, desc.vocab_size, all_reduce, comm,
        )  # fmt: skip
        self._decoder_ref = ctypes.byref(self._decoder)
        self._fn = kernels.lib.decode
        self.kernels = kernels
        self.desc = desc  # keeps the described tensors alive while the native decoder points at them
        self.hidden = hidden
        self.dtype = dtype

    def can_run(self, inputs: ModelInputs) -> bool:
        """Whether the native decoder takes ``inputs`` as they are (else the caller runs eagerly)."""
        if self.kv_scales:  # checked until the first eager write has set every layer's scales
            if not all(float(scale.min()) > 0 for scale in self.kv_scales):
                return False
            self.kv_scales = []
        meta, intermediate = inputs.attn_metadata, inputs.intermediate
        return (
            inputs.num_tokens > 0
            and (intermediate is None) == self.first
            and (intermediate is None or (intermediate.dtype == self.dtype and intermediate.is_contiguous()
                                          and tuple(intermediate.shape) == (inputs.num_tokens, 2 * self.hidden)))
            and (inputs.lora is None or (bool(self._loras) and inputs.lora.num_rows == inputs.num_tokens))
            and all(t.dtype == torch.int64 and t.is_contiguous() for t in (inputs.input_ids, inputs.positions,
                                                                         meta.slot_mapping))
            and all(t.dtype == torch.int32 and t.is_contiguous() for t in (meta.query_start_loc, meta.seq_lens))
            and meta.block_tables.dtype == torch.int32 and meta.block_tables.stride(-1) == 1
        )  # fmt: skip

    def __call__(self, inputs: ModelInputs) -> torch.Tensor:
        """Final normed hidden states ``[tokens, hidden]`` (a pipeline stage before the last: its
        hidden states and residual ``[tokens, 2 * hidden]``), as the eager forward returns them."""
        meta, tokens, intermediate = inputs.attn_metadata, inputs.num_tokens, inputs.intermediate
        out = inputs.input_ids.new_empty((tokens, self.hidden if self.last else 2 * self.hidden), dtype=self.dtype)
        step = _Step(
            inputs.input_ids.data_ptr(), inputs.positions.data_ptr(), meta.slot_mapping.data_ptr(),
            meta.query_start_loc.data_ptr(), meta.seq_lens.data_ptr(), meta.block_tables.data_ptr(),
            meta.block_tables.stride(0), tokens, len(meta.seq_lens_host), out.data_ptr(),
            None if intermediate is None else intermediate.data_ptr(), int(not self.last),
        )  # fmt: skip
        lora = inputs.lora
        self._lora_step.row_slots = None if lora is None else lora.row_slots.data_ptr()
        self._lora_step.num_rows = 0 if lora is None else lora.num_rows
        status = self._fn(self._decoder_ref, ctypes.byref(step), self.kernels.num_threads)
        if status == -2:
            raise IndexError(f"token id outside the vocabulary of {self._decoder.vocab}")
        if status == -3:
            raise IndexError(f"slot_mapping has a slot >= the cache's {self._decoder.num_slots} slots")
        if status == -4:
            raise ValueError(f"the native decoder does not read cache dtype code {self._decoder.cache_dtype}")
        if status == -5:
            raise RuntimeError("the tensor-parallel all-reduce failed: another rank did not reach it in time")
        if status:
            raise MemoryError("the native decoder could not allocate its activation buffers")
        return out


class NativeCpuRunner(Runner):
    """Models that describe themselves (``model.describe``) as one native call a step
    (:class:`FusedDecoder`), other models eagerly."""

    def __init__(self, platform: Any) -> None:
        super().__init__(platform)
        self.fused: FusedDecoder | None = None

    def prepare(self, model: torch.nn.Module, kv_caches: list[Any], config: EngineConfigView) -> None:
        super().prepare(model, kv_caches, config)
        self.fused = None
        if not self.platform.env["CPU_FUSED_DECODE"]:
            logger.info("%s runner: eager (CPU_FUSED_DECODE=0)", self.platform.name)
            return
        describe = getattr(model, "describe", None)
        try:
            _need(describe is not None, f"{type(model).__name__} does not describe itself (no describe())")
            self.fused = FusedDecoder(describe(kv_caches), self.platform.kernels)
        except NotFusable as exc:
            logger.info("%s runner: eager, the native decoder does not run this model: %s", self.platform.name, exc)
            return
        logger.info("%s runner: each step as one native call", self.platform.name)

    def forward(self, inputs: ModelInputs) -> torch.Tensor:
        fused = self.fused
        if fused is not None and fused.can_run(inputs):
            return fused(inputs)
        return super().forward(inputs)
