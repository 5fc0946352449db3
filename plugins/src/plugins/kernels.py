"""Reference kernels: the ops model layers call, in plain torch.

These are correct on every torch device and are the yardstick the conformance kit
measures native kernels against. A backend subclasses :class:`Kernels` and overrides
the ops it does better; the rest fall back to these. Shapes use ``T`` for the number
of new tokens in the flattened batch (see :mod:`plugins.attention`), ``Hq``/``Hk`` for
query/key-value heads and ``D`` for the head size.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from plugins.attention import AttentionMetadata
from plugins.errors import UnsupportedFeature
from plugins.gguf_quants import dequantize
from plugins.int_quant import INT_FORMATS, IntWeight
from plugins.kv_cache import as_bytes, calibrate, quantize
from plugins.kv_cache import dequantize as dequantize_kv
from plugins.lora import LoRAMapping, expand, shrink
from plugins.moe import ExpertWeights, grouped_experts


@dataclass(frozen=True)
class GGUFWeight:
    """A linear weight kept in its GGUF block-quantized form.

    ``data`` is the raw uint8 tensor of ``rows`` rows, each ``row_bytes`` long, for a
    logical ``[rows, cols]`` matrix of quantization type ``qtype`` (``"Q8_0"``, ``"Q4_0"``,
    ``"Q4_1"``, ``"Q4_K"``, ...), exactly as stored in the file.
    """

    qtype: str
    data: torch.Tensor
    rows: int
    cols: int

    def dequantize(self) -> torch.Tensor:
        """float32 ``[rows, cols]`` on ``data``'s device (the SDK's torch reference, :mod:`plugins.gguf_quants`).

        :raises UnsupportedFeature: for a type without a reference dequantization.
        """
        return dequantize(self.qtype, self.data, self.rows, self.cols)


#: for each byte value, which of its 8 bits (low first) are 0: a bitmask byte's forbidden tokens
_FORBIDDEN_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1) == 0


class Kernels:
    """Torch reference implementation of every kernel (device-neutral, float32 math).

    Override any method with a native kernel of the same signature and semantics.
    """

    #: quantized weight formats :meth:`prepare_linear` accepts besides full precision:
    #: ``"int8"`` (weight-only, per-output-channel scales), ``"gguf"``, and the Hugging Face
    #: checkpoint formats of :data:`plugins.int_quant.INT_FORMATS` (weights as
    #: :class:`plugins.int_quant.IntWeight`, which the reference runs by dequantizing per call).
    supported_quantizations: ClassVar[frozenset[str]] = INT_FORMATS

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """``x / rms(x) * weight`` over the last dimension; same dtype as ``x``."""
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (out * weight.float()).to(x.dtype)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(rms_norm(x + residual), x + residual)``; the sum is the new residual."""
        summed = (x.float() + residual.float()).to(x.dtype)
        return self.rms_norm(summed, weight, eps), summed

    def rotary_embedding(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``q [T, Hq, D]`` and ``k [T, Hk, D]`` (GPT-NeoX style, rotate-half).

        ``cos_sin_cache [max_position, D]`` holds ``cos`` in its first ``D/2`` columns and
        ``sin`` in the rest, for each position; ``positions [T]`` indexes it.
        """
        cos, sin = cos_sin_cache[positions.long()].float().chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)

        def rotate(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

        return rotate(q), rotate(k)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``silu(x[:, :I]) * x[:, I:]`` for ``x [T, 2I]``."""
        gate, up = x.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)

    def gelu_tanh_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """``gelu(x[:, :I], approximate="tanh") * x[:, I:]`` for ``x [T, 2I]`` (Gemma's MLP)."""
        gate, up = x.float().chunk(2, dim=-1)
        return (F.gelu(gate, approximate="tanh") * up).to(x.dtype)

    def linear_gelu(
        self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None, approximate: str = "none"
    ) -> torch.Tensor:
        """(optional) ``gelu(linear(x, weight, bias))``, an encoder's MLP up-projection: a backend may
        apply the activation in the product's epilogue (one pass over the output instead of two).

        :param approximate: ``"none"`` (erf) or ``"tanh"``, as :func:`torch.nn.functional.gelu`.
        """
        return F.gelu(self.linear(x, weight, bias), approximate=approximate)

    def apply_token_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        """(optional) Structured outputs: forbid, in place, the tokens a grammar does not allow next.

        :param logits: ``[N, V]`` float logits of the step's sampled rows.
        :param bitmask: int32 ``[len(rows), ceil(V / 32)]`` on the host: bit ``t % 32`` of word
            ``t // 32`` of row ``j`` is 1 when token ``t`` is allowed in ``logits[rows[j]]``.
        :param rows: which rows of ``logits`` the bitmask's rows are, in order.

        Every forbidden logit becomes ``-inf``; other rows and allowed logits are untouched.
        """
        width = logits.shape[1]
        words = bitmask.contiguous().view(torch.uint8).view(len(rows), -1, 4)
        if sys.byteorder == "big":  # bytes of a word from its low bits up
            words = words.flip(-1)
        forbidden = _FORBIDDEN_BITS[words.flatten(1).long()].flatten(1)[:, :width]  # [R, V]
        forbidden = forbidden.to(logits.device)
        if list(rows) == list(range(logits.shape[0])):
            logits.masked_fill_(forbidden, float("-inf"))
            return
        index = torch.tensor(rows, dtype=torch.long, device=logits.device)
        logits.index_copy_(0, index, logits.index_select(0, index).masked_fill_(forbidden, float("-inf")))

    def encoder_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        query_start_loc: torch.Tensor,
        seq_lens: list[int],
        scale: float,
    ) -> torch.Tensor:
        """(optional) Pooling: bidirectional attention within each sequence of a flattened batch (encoders).

        :param q: ``[T, Hq, D]`` queries of every sequence's tokens, concatenated.
        :param k: ``[T, Hk, D]`` keys of the same tokens; ``v`` their values. No KV cache is read or written.
        :param query_start_loc: int32 ``[N + 1]`` on ``q``'s device: sequence ``i`` owns rows
            ``query_start_loc[i]:query_start_loc[i + 1]``.
        :param seq_lens: the ``N`` sequences' lengths on the host (they sum to ``T``).
        :param scale: the softmax scale.

        Every query sees every key of its own sequence, none of another's (no causal mask).
        GQA: query head ``h`` reads key-value head ``h // (Hq // Hk)``. Returns ``[T, Hq, D]`` in
        ``q``'s dtype. The reference attends one sequence at a time (no padding, no mask) in float32.
        """
        out = torch.empty_like(q)
        group = q.shape[1] // k.shape[1]
        start = 0
        for n in seq_lens:
            rows = slice(start, start + n)
            query, keys, values = (x[rows].float().transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, H, n, D]
            if group > 1:
                keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
            out[rows] = F.scaled_dot_product_attention(query, keys, values, scale=scale)[0].transpose(0, 1)
            start += n
        return out

    def lora_shrink(self, x: torch.Tensor, lora_a: torch.Tensor, mapping: LoRAMapping) -> torch.Tensor:
        """(optional) LoRA: the first product of a mixed batch's adapter deltas (:mod:`plugins.lora`).

        :param x: ``[T', in]`` the adapted linear's input (``T' >= mapping.num_rows``: padded rows are base rows).
        :param lora_a: ``[S, R, in]`` the linear's ``A`` matrices, one per adapter slot, in the compute dtype.
        :param mapping: each row's slot (``-1``: base row).

        Returns float32 ``[T', R]``: ``lora_a[slot(t)] @ x[t]`` on adapter rows, 0 on base rows.
        """
        return shrink(x, lora_a, mapping)

    def lora_expand(
        self, y: torch.Tensor, h: torch.Tensor, lora_b: torch.Tensor, mapping: LoRAMapping, offset: int = 0
    ) -> None:
        """(optional) LoRA: add the second product to the linear's output, in place.

        :param y: ``[T', N_total]`` the base linear's output.
        :param h: float32 ``[T', R]`` from :meth:`lora_shrink` (a column slice of it for one part
            of a fused projection).
        :param lora_b: ``[S, N, R]`` the ``B`` matrices (scale folded in), one per slot.
        :param offset: the first of the ``N`` columns of ``y`` this part writes.

        ``y[t, offset : offset + N] += lora_b[slot(t)] @ h[t]`` on adapter rows (summed in
        float32, stored in ``y``'s dtype); base rows and other columns are untouched.
        """
        expand(y, h, lora_b, mapping, offset)

    def write_kv_cache(
        self,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scale: torch.Tensor | None = None,
    ) -> None:
        """Store ``k, v [T, Hk, D]`` into flat cache slot ``slot_mapping[t]`` (in place).

        Caches are ``[num_blocks, block_size, Hk, D]``; slot ``s`` is block
        ``s // block_size``, offset ``s % block_size``. Tokens whose slot is negative
        (padding) are not written. A one-byte cache (:mod:`plugins.kv_cache`) stores the
        values saturated to its range; with ``kv_scale`` (``float32 [2]``, E4M3 caches
        only) it stores ``k / kv_scale[0]`` and ``v / kv_scale[1]``, first setting a scale
        that is still 0 from these values (:func:`plugins.kv_cache.calibrate`).
        """
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        k, v = k[keep], v[keep]
        k_scale = v_scale = None
        if kv_scale is not None and slots.numel():
            calibrate(kv_scale, k, v)
            k_scale, v_scale = kv_scale[0], kv_scale[1]
        k_flat = as_bytes(k_cache).view(-1, *k_cache.shape[2:])
        v_flat = as_bytes(v_cache).view(-1, *v_cache.shape[2:])
        k_flat.index_copy_(0, slots, as_bytes(quantize(k, k_cache.dtype, k_scale)))
        v_flat.index_copy_(0, slots, as_bytes(quantize(v, v_cache.dtype, v_scale)))

    def paged_attention(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        kv_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Causal attention of ``q [T, Hq, D]`` over each sequence's cached K/V.

        The keys and values of this step's tokens are already in the cache
        (:meth:`write_kv_cache` runs first). Query ``i`` of a sequence with ``query_len``
        new tokens and ``seq_len`` context, at position ``p = seq_len - query_len + i``,
        sees keys ``0 ... p``; with a ``sliding_window`` ``W`` (a layer's local attention)
        only the last ``W`` of them, ``p - W + 1 ... p``. GQA: query head ``h`` reads key-value head ``h // (Hq // Hk)``. Returns
        ``[T, Hq, D]`` in ``q``'s dtype. Cached values are read as float32, times
        ``kv_scale`` (K, V) when given (an E4M3 cache, see :meth:`write_kv_cache`).
        """
        k_scale, v_scale = (None, None) if kv_scale is None else (kv_scale[0], kv_scale[1])
        out = torch.empty_like(q)
        block_size = k_cache.shape[1]
        group = q.shape[1] // k_cache.shape[2]
        start = 0
        for i, (q_len, s_len) in enumerate(zip(meta.query_lens_host, meta.seq_lens_host, strict=False)):
            if s_len == 0:  # padding sequence of a runner: nothing to attend to
                out[start : start + q_len] = 0
                start += q_len
                continue
            num_blocks = -(-s_len // block_size)
            blocks = meta.block_tables[i, :num_blocks].long()
            keys = dequantize_kv(as_bytes(k_cache)[blocks].view(k_cache.dtype).flatten(0, 1)[:s_len], k_scale)
            values = dequantize_kv(as_bytes(v_cache)[blocks].view(v_cache.dtype).flatten(0, 1)[:s_len], v_scale)
            keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
            values = values.repeat_interleave(group, dim=1).transpose(0, 1)
            query = q[start : start + q_len].float().transpose(0, 1)  # [Hq, Q, D]
            scores = torch.matmul(query, keys.transpose(1, 2)) * scale  # [Hq, Q, S]
            q_pos = torch.arange(s_len - q_len, s_len, device=q.device).unsqueeze(1)
            k_pos = torch.arange(s_len, device=q.device).unsqueeze(0)
            hidden = k_pos > q_pos
            if sliding_window is not None:
                hidden |= k_pos <= q_pos - sliding_window
            scores.masked_fill_(hidden, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            out[start : start + q_len] = torch.matmul(probs, values).transpose(0, 1).to(q.dtype)
            start += q_len
        return out

    def prepare_linear(self, weight: torch.Tensor | GGUFWeight, quantization: str | None) -> Any:
        """Turn a loaded weight into the form :meth:`linear` takes (called once at load).

        :param weight: ``[out_features, in_features]`` in the compute dtype, a
            :class:`GGUFWeight` when ``"gguf"`` is in :attr:`supported_quantizations`, or an
            :class:`~plugins.int_quant.IntWeight` of a quantized Hugging Face checkpoint.
        :param quantization: ``None`` for full precision, or one of
            :attr:`supported_quantizations` (a checkpoint's linears left unquantized, such as
            ``lm_head``, come as dense tensors with the checkpoint's format).
        """
        if isinstance(weight, IntWeight) or (quantization in INT_FORMATS and isinstance(weight, torch.Tensor)):
            return weight
        if quantization is not None or isinstance(weight, GGUFWeight):
            raise UnsupportedFeature(
                f"quantization {quantization!r} is not supported by the reference kernels; "
                "supported: none (full precision)"
            )
        return weight

    def linear(self, x: torch.Tensor, weight: Any, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ weight.T + bias`` for ``x [T, in]`` and a weight from :meth:`prepare_linear`."""
        if isinstance(weight, IntWeight):
            return weight.reference_linear(x, bias)
        return F.linear(x, weight, bias)

    def prepare_experts(self, experts: ExpertWeights, quantization: str | None) -> Any:
        """Turn a MoE layer's stacked experts into the form :meth:`fused_moe` takes (called once
        at load; a backend may repack them). ``quantization`` as for :meth:`prepare_linear`;
        GGUF experts come as ``GGUFWeight`` stacks when ``"gguf"`` is in :attr:`supported_quantizations`.
        The reference keeps them as they are (GGUF rows are dequantized per call)."""
        return experts

    def fused_moe(
        self, x: torch.Tensor, experts: Any, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """The expert products of a batch: ``sum_k topk_weights[t, k] * down_e(silu(gate_e x[t]) * up_e x[t])``
        with ``e = topk_ids[t, k]``, for ``x [T, H]``, ``topk_weights`` float32 ``[T, k]`` and
        ``topk_ids`` int64 ``[T, k]`` (distinct experts per token); returns ``[T, H]`` in ``x``'s
        dtype. ``experts`` as :meth:`prepare_experts` returned them. Under tensor parallelism
        each rank holds a slice of every expert's intermediate dimension and returns its
        partial sum (core adds the ranks' sums)."""
        return grouped_experts(x, experts, topk_weights, topk_ids)
