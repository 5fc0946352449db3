"""An OpenVINO model of a Llama-family decoder, built from core's model description.

One graph serves every step: its inputs are the step's token ids and positions and
OpenVINO's PagedAttention metadata (``past_lens``, ``subsequence_begins``,
``block_indices``, ``block_indices_begins``, ``max_context_len``), and one key and one
value cache per layer (``key_cache.{i}``, ``value_cache.{i}``); its output is the final
normed hidden state of each token, in the compute dtype (float32 or bfloat16). Each layer's attention is OpenVINO's
``PagedAttentionExtension``, which writes the new keys and values into the caches itself.
Built with the LM head, it takes ``logit_rows`` too (the rows core samples, chosen each step)
and outputs their float32 ``logits`` as well: the LM head's product on those rows alone, in the
same infer as the layers.
"""

from __future__ import annotations

from typing import Any

import torch
from plugins.model import LayerDescription, ModelDescription

from plugin_openvino.weights import constant, matmul_node

#: the inputs of PagedAttentionExtension after max_context_len that this graph does not use
#: (score aggregation, cache rotation, xattention, sinks, adaptive RKV, token types, qq bias)
_UNUSED_PA_INPUTS = (
    ("i32", [0]), ("i32", [0]), ("i32", [0]), ("f32", [0]), ("f32", [0]), ("i32", []), ("i32", []), ("f32", [0]),
    ("i32", []), ("i32", [0]), ("i32", [0]), ("i32", [0]), ("i32", [0]), ("u8", [0]), ("i32", [0]),
)  # fmt: skip
_UNUSED_PA_VALUES = (None, None, None, None, None, 64, 8, None, 0, None, None, None, None, None, None)


class NotBuildable(Exception):
    """The model (or a weight, dtype or option of it) is not one this graph runs."""


def _need(ok: bool, why: str) -> None:
    if not ok:
        raise NotBuildable(why)


class GraphBuilder:
    """Builds the ``ov.Model`` of a :class:`ModelDescription` (see the module docstring).

    :ivar keep: the torch tensors the graph's constants share memory with (keep them alive
        as long as any model compiled from the graph).
    """

    def __init__(self, desc: ModelDescription, compress_weights: bool, kv_type: Any, q4_1: str = "f16") -> None:
        _need(len(desc.layers) > 0, "no layers")
        _need(desc.sliding_window is None, "sliding-window attention")
        for i, layer in enumerate(desc.layers):
            _need(layer.moe is None and layer.gate_up is not None, f"layer {i} is a mixture of experts")
            _need(layer.kv_scale is None, f"layer {i} has a one-byte (FP8) KV cache")
        self.desc = desc
        self.compress = compress_weights
        self.q4_1 = q4_1
        self.kv_type = kv_type
        self.keep: list[torch.Tensor] = []

    def build(self, lm_head: Any = None) -> Any:
        """The ``ov.Model``; with ``lm_head`` (the LM head's ``[vocab, hidden]`` weight, a tensor or
        a :class:`plugins.kernels.GGUFWeight`) also the ``logit_rows`` input and the ``logits`` output.

        :raises NotBuildable: for a weight form the graph does not take.
        """
        import openvino as ov
        import openvino.opset13 as ops

        desc = self.desc
        params = {
            "input_ids": ops.parameter([-1], ov.Type.i64, name="input_ids"),
            "positions": ops.parameter([-1], ov.Type.i64, name="positions"),
        }
        for name in ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins"):
            params[name] = ops.parameter([-1], ov.Type.i32, name=name)
        params["max_context_len"] = ops.parameter([], ov.Type.i32, name="max_context_len")
        hidden = ops.gather(self._f32(constant(desc.embedding, self.keep)), params["input_ids"], 0)
        cos_sin = ops.gather(self._f32(constant(desc.cos_sin, self.keep)), params["positions"], 0)
        cos, sin = ops.split(cos_sin, 1, 2).outputs()  # [T, D/2] each
        # [T, 1, D] each, both halves: the rotate-half form OpenVINO fuses into one RoPE node
        rope = tuple(ops.unsqueeze(ops.concat([half, half], 1), 1) for half in (cos, sin))
        caches = []
        for i, layer in enumerate(desc.layers):
            k_cache = ops.parameter(ov.PartialShape.dynamic(), self.kv_type, name=f"key_cache.{i}")
            v_cache = ops.parameter(ov.PartialShape.dynamic(), self.kv_type, name=f"value_cache.{i}")
            caches += [k_cache, v_cache]
            hidden = self._layer(layer, hidden, rope, k_cache, v_cache, params)
        out = self._rms_norm(hidden, desc.final_norm)
        results = []
        if lm_head is not None:
            params["logit_rows"] = ops.parameter([-1], ov.Type.i32, name="logit_rows")
            logits = self.linear_product(ops.gather(out, params["logit_rows"], 0), lm_head)
            results.append(ops.result(logits, name="logits"))
        if desc.dtype == torch.bfloat16:
            # OpenVINO's CPU plugin keeps in float32 every node from a float32 output up to the
            # products before it: here the whole residual stream (openvino-genai's ends in the
            # LM head's product); an output in bfloat16 lets it run in bfloat16, as torch's does
            out = ops.convert(out, ov.Type.bf16)
        results.insert(0, ops.result(out, name="hidden"))
        return ov.Model(results, list(params.values()) + caches, "core_decoder")

    def _f32(self, node: Any) -> Any:
        import openvino as ov
        import openvino.opset13 as ops

        return node if node.get_output_element_type(0) == ov.Type.f32 else ops.convert(node, ov.Type.f32)

    def _rms_norm(self, x: Any, weight: torch.Tensor) -> Any:
        import openvino as ov
        import openvino.opset13 as ops

        mean = ops.reduce_mean(ops.multiply(x, x), ops.constant([-1], ov.Type.i64), keep_dims=True)
        eps = ops.constant(self.desc.rms_norm_eps, ov.Type.f32)
        normed = ops.multiply(x, ops.power(ops.add(mean, eps), ops.constant(-0.5, ov.Type.f32)))
        return ops.multiply(normed, self._f32(constant(weight, self.keep)))

    def linear_product(self, x: Any, weight: Any) -> Any:
        """``x @ weight.T`` (:func:`plugin_openvino.weights.matmul_node`), its constants kept in :attr:`keep`.

        :raises NotBuildable: for a weight form the graph does not take.
        """
        try:
            return matmul_node(x, weight, self.keep, self.compress, self.q4_1)
        except TypeError as exc:
            raise NotBuildable(f"linear weights of form {exc}") from None

    def _linear(self, x: Any, linear: Any) -> Any:
        import openvino.opset13 as ops

        y = self.linear_product(x, linear.weight)
        return y if linear.bias is None else ops.add(y, self._f32(constant(linear.bias, self.keep)))

    def _heads(self, x: Any, num_heads: int, norm: torch.Tensor | None, rope: tuple[Any, Any]) -> Any:
        """``x [T, H * D]`` -> rotated (after the optional per-head norm) ``[T, H * D]``."""
        import openvino as ov
        import openvino.opset13 as ops

        d = self.desc.head_dim
        heads = ops.reshape(x, ops.constant([0, num_heads, d], ov.Type.i64), special_zero=True)
        if norm is not None:
            heads = self._rms_norm(heads, norm)
        cos, sin = rope
        half = d // 2
        x1 = ops.slice(heads, ops.constant([0]), ops.constant([half]), ops.constant([1]), ops.constant([2]))
        x2 = ops.slice(heads, ops.constant([half]), ops.constant([d]), ops.constant([1]), ops.constant([2]))
        rotate_half = ops.concat([ops.multiply(x2, ops.constant(-1.0, ov.Type.f32)), x1], -1)
        rotated = ops.add(ops.multiply(heads, cos), ops.multiply(rotate_half, sin))
        return ops.reshape(rotated, ops.constant([0, num_heads * d], ov.Type.i64), special_zero=True)

    def _layer(self, layer: LayerDescription, hidden: Any, rope: Any, k_cache: Any, v_cache: Any, params: dict) -> Any:
        import openvino as ov
        import openvino.opset13 as ops

        desc = self.desc
        q_size, kv_size = desc.num_heads * desc.head_dim, desc.num_kv_heads * desc.head_dim
        qkv = self._linear(self._rms_norm(hidden, layer.input_norm), layer.qkv)
        q, k, v = ops.variadic_split(qkv, 1, ops.constant([q_size, kv_size, kv_size], ov.Type.i64)).outputs()
        q = self._heads(q, desc.num_heads, layer.q_norm, rope)
        k = self._heads(k, desc.num_kv_heads, layer.k_norm, rope)
        attn = self._paged_attention(q, k, v, k_cache, v_cache, params)
        hidden = ops.add(hidden, self._linear(attn, layer.o))
        gate_up = self._linear(self._rms_norm(hidden, layer.post_attention_norm), layer.gate_up)
        gate, up = ops.split(gate_up, 1, 2).outputs()
        return ops.add(hidden, self._linear(ops.multiply(ops.swish(gate), up), layer.down))

    def _paged_attention(self, q: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, params: dict) -> Any:
        import openvino as ov
        import openvino.opset13 as ops
        from openvino._pyopenvino.op import _PagedAttentionExtension

        desc = self.desc
        fixed = [
            ops.constant(desc.attn_scale, ov.Type.f32),
            ops.constant(0, ov.Type.i32),  # sliding window: none
            ops.constant([], ov.Type.f32),  # no ALiBi slopes
            params["max_context_len"],
        ]
        for (type_name, shape), value in zip(_UNUSED_PA_INPUTS, _UNUSED_PA_VALUES, strict=True):
            ov_type = getattr(ov.Type, type_name)
            fixed.append(ops.constant(value if value is not None else [], ov_type) if not shape else
                         ov.op.Constant(ov_type, ov.Shape(shape), []))  # fmt: skip
        names = ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins")
        inputs = [q, k, v, k_cache, v_cache, *(params[n] for n in names), *fixed]
        pa = _PagedAttentionExtension([node.output(0) if hasattr(node, "output") else node for node in inputs])
        info = pa.get_rt_info()
        for name, value in (("num_k_heads", desc.num_kv_heads), ("k_head_size", desc.head_dim),
                            ("num_v_heads", desc.num_kv_heads), ("v_head_size", desc.head_dim)):  # fmt: skip
            info[name] = value
        return pa.output(0)
