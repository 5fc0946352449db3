"""The GPU plugins' kernel set: Triton kernels with the reference's signatures.

Layouts the Triton kernels do not take (a strided last dimension, K and V caches
with different strides, a cos/sin cache of another width) fall back to the torch
reference, so every input the reference accepts stays correct.
"""

from __future__ import annotations

import dataclasses
import os

import torch
from plugins.attention import AttentionMetadata
from plugins.kernels import Kernels
from plugins.moe import ExpertWeights

BACKENDS = ("triton", "reference")
SKINNY_GEMM = ("auto", "triton", "cublas", None)


def _unit_last_stride(*tensors: torch.Tensor) -> bool:
    return all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in tensors)


def is_interpreted() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1``: CPU tensors, no GPU)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def attention_tiles(dtype: torch.dtype, head_size: int) -> tuple[int, int]:
    """``(block_m, block_n)`` of the attention kernels on a GPU.

    Sized by the bytes of one K/V row so that the pipelined tiles fit the ~99 KiB of
    shared memory of the smallest Ampere+ parts (sm_86/sm_89), fp32 and head size 256
    included (checked by compiling for sm_86, see tests/test_compile.py).
    """
    row_bytes = torch.finfo(dtype).bits // 8 * max(16, 1 << (head_size - 1).bit_length())
    if row_bytes <= 256:
        return 64, 64
    if row_bytes <= 512:
        return 32, 32
    return 16, 16


class TritonKernels(Kernels):
    """Triton paged attention (prefill + split-K decode), norms, rotary, SiLU-and-mul, KV write,
    mixture-of-experts products.

    :param attention_backend: ``"triton"`` or ``"reference"`` (the torch reference).
    :param ops_backend: the same choice for the other ops.
    :param decode_split_tokens: fewest context tokens one decode split handles.
    :param num_sms: multiprocessors (NVIDIA SMs, AMD CUs, Intel Xe-cores) that decode splits
        fill; default: the current CUDA/HIP GPU's, else 4.
    :param tiles: ``(block_m, block_n)``, queries per prefill program and keys per
        attention tile; default :func:`attention_tiles` (16, 16 under the interpreter).
    :param skinny_gemm: products of up to 4 rows (decode): ``"cublas"`` (default) through torch,
        ``"auto"`` times the Triton skinny kernel against cuBLAS (CUDA graphs) per shape and
        keeps the faster, ``"triton"`` always takes it (:mod:`plugins.gpu_triton.gemv`: why
        cuBLAS is the default); None: every product through torch, for a platform the
        chooser cannot time on (xpu).
    """

    def __init__(
        self,
        attention_backend: str = "triton",
        ops_backend: str = "triton",
        decode_split_tokens: int = 256,
        num_sms: int | None = None,
        tiles: tuple[int, int] | None = None,
        skinny_gemm: str | None = "cublas",
    ) -> None:
        for label, value, allowed in (
            ("attention_backend", attention_backend, BACKENDS),
            ("ops_backend", ops_backend, BACKENDS),
            ("skinny_gemm", skinny_gemm, SKINNY_GEMM),
        ):
            if value not in allowed:
                raise ValueError(f"{label} must be one of {', '.join(map(str, allowed))}; got {value!r}")
        self.attention_backend = attention_backend
        self.ops_backend = ops_backend
        self.decode_split_tokens = decode_split_tokens
        on_gpu = torch.cuda.is_available()
        self.num_sms = num_sms or (torch.cuda.get_device_properties(0).multi_processor_count if on_gpu else 4)
        # the interpreter pays per program and per op: small tiles keep CPU tests fast
        self.tiles = tiles or ((16, 16) if is_interpreted() else None)
        self.skinny_gemm = skinny_gemm
        self._skinny = None  # the SkinnyChooser, made on the first product (it imports Triton)

    @property
    def is_graph_safe(self) -> bool:
        """Whether every op reads lengths from device tensors only (CUDA graphs can replay it).

        The reference attention plans on the host lists, which a graph would freeze.
        """
        return self.attention_backend == "triton"

    @property
    def skinny_choices(self) -> list[dict]:
        """What each decode product shape timed so far runs, with the times seen (``auto`` mode)."""
        if self._skinny is None:
            return []
        return [
            {"rows": rows, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."), "bias": bias,
             "runs": "cuBLAS" if c.config is None else f"skinny {c.config}",
             "skinny_us": round(c.skinny_us, 2), "cublas_us": round(c.cublas_us, 2)}
            for (rows, n, k, dtype, bias), c in self._skinny.choices.items()
        ]  # fmt: skip

    def _triton_ops(self, *tensors: torch.Tensor) -> bool:
        return self.ops_backend == "triton" and _unit_last_stride(*tensors)

    def rms_norm(self, x, weight, eps):
        if not self._triton_ops(x, weight) or x.dim() == 0:
            return super().rms_norm(x, weight, eps)
        from plugins.gpu_triton import ops

        return ops.rms_norm(x.reshape(-1, x.shape[-1]), weight, eps).view(x.shape)

    def fused_add_rms_norm(self, x, residual, weight, eps):
        if not self._triton_ops(x, residual, weight) or x.shape != residual.shape or x.dim() == 0:
            return super().fused_add_rms_norm(x, residual, weight, eps)
        from plugins.gpu_triton import ops

        width = x.shape[-1]
        out, summed = ops.rms_norm(x.reshape(-1, width), weight, eps, residual=residual.reshape(-1, width))
        return out.view(x.shape), summed.view(x.shape)

    def rotary_embedding(self, positions, q, k, cos_sin_cache):
        head_size = q.shape[-1]
        if (
            not self._triton_ops(q, k, cos_sin_cache)
            or head_size % 2
            or k.shape[-1] != head_size
            or cos_sin_cache.shape[-1] != head_size
        ):
            return super().rotary_embedding(positions, q, k, cos_sin_cache)
        from plugins.gpu_triton import ops

        return ops.rotary_embedding(positions.contiguous(), q, k, cos_sin_cache)

    def silu_and_mul(self, x):
        if not self._triton_ops(x) or x.shape[-1] % 2 or x.dim() == 0:
            return super().silu_and_mul(x)
        from plugins.gpu_triton import ops

        out = ops.silu_and_mul(x.reshape(-1, x.shape[-1]))
        return out.view(*x.shape[:-1], x.shape[-1] // 2)

    def linear(self, x, weight, bias=None):
        """Decode-sized products (see ``skinny_gemm``) on the Triton skinny kernel where it is
        faster; everything else through the reference (cuBLAS)."""
        if (
            self.ops_backend == "triton"
            and self.skinny_gemm in ("auto", "triton")  # the default (cublas) costs no check per product
            and isinstance(weight, torch.Tensor)
            and x.dim() == 2
            and x.dtype == weight.dtype
            and _unit_last_stride(x)
            and weight.is_contiguous()
        ):
            from plugins.gpu_triton.gemv import SkinnyChooser, skinny_linear

            if self._skinny is None:
                self._skinny = SkinnyChooser(self.skinny_gemm)
            config = self._skinny.config(x, weight, bias)
            if config is not None:
                return skinny_linear(x, weight, bias, config)
        return super().linear(x, weight, bias)

    def apply_token_bitmask(self, logits, bitmask, rows):
        """Triton: one program per (row, block of tokens), the bitmask copied to the device once."""
        if not self._triton_ops(logits) or logits.dtype != torch.float32:
            return super().apply_token_bitmask(logits, bitmask, rows)
        from plugins.gpu_triton import ops

        device = logits.device
        index = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        ops.apply_token_bitmask(logits, bitmask.contiguous().to(device, non_blocking=True), index)

    def prepare_experts(self, experts: ExpertWeights, quantization):
        """Dense expert stacks made contiguous for the grouped GEMM; GGUF stacks as the reference keeps them."""
        if isinstance(experts.gate_up, torch.Tensor) and isinstance(experts.down, torch.Tensor):
            return dataclasses.replace(experts, gate_up=experts.gate_up.contiguous(), down=experts.down.contiguous())
        return super().prepare_experts(experts, quantization)

    def fused_moe(self, x, experts, topk_weights, topk_ids):
        """Triton grouped GEMM over the pairs sorted by expert, silu * mul fused between gate/up and
        down (:mod:`plugins.gpu_triton.moe`), for dense experts in ``x``'s dtype; else the reference."""
        dense = isinstance(experts.gate_up, torch.Tensor) and isinstance(experts.down, torch.Tensor)
        if (
            not dense
            or not self._triton_ops(x, experts.gate_up, experts.down)
            or x.dim() != 2
            or {experts.gate_up.dtype, experts.down.dtype} != {x.dtype}
        ):
            return super().fused_moe(x, experts, topk_weights, topk_ids)
        from plugins.gpu_triton import moe

        return moe.fused_moe(x, experts.gate_up, experts.down, topk_weights, topk_ids)

    def write_kv_cache(self, k, v, k_cache, v_cache, slot_mapping, kv_scale=None):
        """Triton copy; a one-byte (FP8) cache runs the SDK's torch reference."""
        if (
            not self._triton_ops(k, v, k_cache, v_cache)
            or k_cache.stride() != v_cache.stride()
            or k_cache.element_size() == 1
        ):
            return super().write_kv_cache(k, v, k_cache, v_cache, slot_mapping, kv_scale)
        from plugins.gpu_triton import ops

        ops.write_kv_cache(k, v, k_cache, v_cache, slot_mapping.contiguous())

    def paged_attention(self, q, k_cache, v_cache, meta: AttentionMetadata, scale, sliding_window=None, kv_scale=None):
        """Triton attention: the split-K decode path when every query length is 1, else prefill.

        Grids depend only on host sizes (``num_seqs``, ``max_query_len``,
        ``max_seq_len``); lengths and block tables are read on the device. Sliding-window
        layers and one-byte (FP8) caches run the torch reference.
        """
        if (
            sliding_window is not None
            or k_cache.element_size() == 1
            or self.attention_backend != "triton"
            or not _unit_last_stride(q, k_cache, v_cache)
            or k_cache.stride() != v_cache.stride()
        ):
            return super().paged_attention(q, k_cache, v_cache, meta, scale, sliding_window, kv_scale)
        from plugins.gpu_triton import attention
        from plugins.gpu_triton.splits import plan_decode_splits

        block_m, block_n = self.tiles or attention_tiles(q.dtype, q.shape[-1])
        if meta.num_seqs and meta.is_decode_only:
            splits = plan_decode_splits(
                meta.num_seqs, k_cache.shape[2], meta.max_seq_len, self.num_sms, self.decode_split_tokens, block_n
            )
            return attention.decode_attention(q, k_cache, v_cache, meta, scale, splits, block_n)
        return attention.prefill_attention(q, k_cache, v_cache, meta, scale, block_m, block_n)
