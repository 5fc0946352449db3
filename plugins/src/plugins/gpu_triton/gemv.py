"""Skinny products: ``x @ W.T (+ b)`` for decode batches of a few rows, as one Triton kernel.

A decode step of batch 1-8 reads every weight once to make a few output rows. cuBLAS
picks tensor-core tiles for these (``nvjet ..._128x8``, split-K with a second reduce
kernel for a long K): on an H200 the Qwen2-0.5B shapes reached 0.4-2.6 TB/s of the
~4.3 available (bench/RESULTS.md, issue 43). This kernel gives each program
``BLOCK_N`` weight rows and every input row: it streams its rows once, in ``BLOCK_K``
chunks, multiplies in float32 on the CUDA cores and needs no second kernel.

Whether it beats cuBLAS depends on the shape and the GPU, so :class:`SkinnyChooser`
times both (and a few tile shapes) the first time a shape runs outside a graph
capture (the runner warms every captured size up first) and keeps the faster.

Measured on an H200 (bench/RESULTS.md, issue 43): timed alone, the kernel beat cuBLAS on
the short weights at 1-4 rows (qkv 896x1152: 3.0 vs 4.4 us, o_proj 896x896: 2.7 vs 4.7 us,
down at one row 7.5 vs 7.9 us) and lost on gate_up, on lm_head and at 8 rows everywhere;
end to end the batch-1 decode gained 1.2% (792 vs 783 tok/s, within run-to-run noise),
not the ~7% those times add up to. So cuBLAS stays the default and ``auto`` is opt-in.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

logger = logging.getLogger(__name__)

#: most rows a skinny product takes (at 8 rows cuBLAS won every shape on an H200)
MAX_ROWS = 4
#: ``(block_n, block_k, num_warps)`` tried per shape (each a compile per rows bucket): few rows
#: per program and a long K chunk give a short weight (o_proj, K=896) hundreds of programs
#: with all their loads in flight at once; (2, 1024, 4) won every shape the kernel won on an H200
CONFIGS: tuple[tuple[int, int, int], ...] = ((2, 1024, 4), (4, 512, 4), (8, 256, 4))
#: largest ``rows bucket x block_n x block_k`` product a program holds in registers (no
#: spills on sm_90 at 4 warps: ``ptxas -v`` on the compiled kernels)
MAX_TILE = 8192
#: the tile of mode ``"triton"`` (and the interpreter's tests)
DEFAULT_CONFIG = (2, 1024, 4)
#: weight bytes one timing streams per call round, so that no call finds its weight in L2
#: (50 MiB on an H100, 60 MiB on an H200): decode reads each weight once per step
FLUSH_BYTES = 128 << 20
#: weight copies one timing's graph cycles through at most (a graph of a launch per copy)
MAX_COPIES = 64
#: smaller weights are not timed (cuBLAS): their products cost a launch whatever runs them,
#: and timing every tiny shape of a test model compiled dozens of kernels (a kit check on an
#: H200 ran past its 60 s timeout)
MIN_TIMED_BYTES = 256 << 10
#: graph replays per timing
REPLAYS = 5


@triton.jit
def _skinny_kernel(
    x_ptr, x_stride, w_ptr, w_stride, b_ptr, out_ptr, out_stride,
    M, N, K,
    HAS_BIAS: tl.constexpr, M_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m = tl.arange(0, M_PAD)
    n_mask = n < N
    m_mask = m < M
    w_rows = w_ptr + n[:, None].to(tl.int64) * w_stride
    acc = tl.zeros((M_PAD, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_mask = k < K
        w = tl.load(w_rows + k[None, :], mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_ptr + m[:, None] * x_stride + k[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        acc += tl.sum(x.to(tl.float32)[:, None, :] * w[None, :, :], axis=2)
    if HAS_BIAS:
        acc += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    out = out_ptr + m[:, None] * out_stride + n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: tuple[int, int, int] = DEFAULT_CONFIG
) -> torch.Tensor:
    """``x @ weight.T + bias`` for ``x [M, K]`` (``M <= MAX_ROWS``, unit last stride) and a
    contiguous ``weight [N, K]``; float32 accumulation, one rounding on the store."""
    rows, k = x.shape
    n = weight.shape[0]
    if rows > MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {MAX_ROWS} rows, got {rows}")
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    block_n, block_k, warps = config
    if rows:
        _skinny_kernel[(triton.cdiv(n, block_n),)](
            x, x.stride(0), weight, weight.stride(0), bias if bias is not None else weight, out, out.stride(0),
            rows, n, k, HAS_BIAS=bias is not None, M_PAD=triton.next_power_of_2(rows),
            BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps,
        )  # fmt: skip
    return out


@dataclass(frozen=True)
class Choice:
    """What a shape runs: ``config`` for the skinny kernel, or None for cuBLAS; the times seen."""

    config: tuple[int, int, int] | None
    skinny_us: float
    cublas_us: float


class SkinnyChooser:
    """Per ``(rows bucket, N, K, dtype, bias)``: the skinny kernel (its fastest tile) or cuBLAS.

    :param mode: ``"auto"`` times both on first use (on a GPU, outside graph capture; a shape
        first met inside a capture runs cuBLAS), ``"triton"`` always takes the skinny kernel
        with :data:`DEFAULT_CONFIG`, ``"cublas"`` never does.
    """

    def __init__(self, mode: str = "auto") -> None:
        self.mode = mode
        self.choices: dict[tuple, Choice] = {}

    def config(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[int, int, int] | None:
        """The tile to run ``x @ weight.T`` with, or None for cuBLAS."""
        if self.mode == "cublas" or x.shape[0] > MAX_ROWS:
            return None
        if self.mode == "triton":
            return DEFAULT_CONFIG
        key = (triton.next_power_of_2(x.shape[0]), *weight.shape, weight.dtype, bias is not None)
        choice = self.choices.get(key)
        if choice is None:
            small = weight.numel() * weight.element_size() < MIN_TIMED_BYTES
            if small or not x.is_cuda or torch.cuda.is_current_stream_capturing():
                return None
            try:
                choice = _time(x, weight, bias)
            except torch.cuda.OutOfMemoryError:  # the weight copies of the timing did not fit
                choice = Choice(None, float("nan"), float("nan"))
            self.choices[key] = choice
            logger.info(
                "skinny GEMM rows<=%d N=%d K=%d: %s (skinny %.1f us, cuBLAS %.1f us)",
                key[0], key[1], key[2], "cuBLAS" if choice.config is None else f"tile {choice.config}",
                choice.skinny_us, choice.cublas_us,
            )  # fmt: skip
        return choice.config


def _time(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> Choice:
    """Time cuBLAS and the tiles of :data:`CONFIGS` that fit ``x``'s rows; keep the fastest.

    As in a decode step: replays of a CUDA graph (no launch cost) over copies of the weight
    that together exceed L2 (every call reads its weight from memory)."""
    extra = min(MAX_COPIES - 1, FLUSH_BYTES // (weight.numel() * weight.element_size()))
    copies = [weight] + [weight.clone() for _ in range(extra)]

    def us(fn) -> float:
        fn(weight)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for w in copies:
                fn(w)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        return 1000 * start.elapsed_time(end) / (REPLAYS * len(copies))

    rows = triton.next_power_of_2(x.shape[0])
    cublas = us(lambda w: torch.nn.functional.linear(x, w, bias))
    timed = {
        cfg: us(lambda w, cfg=cfg: skinny_linear(x, w, bias, cfg))
        for cfg in CONFIGS
        if rows * cfg[0] * cfg[1] <= MAX_TILE
    }
    best = min(timed, key=timed.__getitem__)
    return Choice(best if timed[best] < cublas else None, timed[best], cublas)
