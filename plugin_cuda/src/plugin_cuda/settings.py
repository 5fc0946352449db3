"""The environment variables of the cuda platform and their parsers.

Read as ``CORE_<NAME>`` (or ``VLLM_<NAME>``) through :class:`plugins.EnvVar`.
"""

from __future__ import annotations

from plugins import EnvVar
from plugins.env import parse_fraction, parse_int_list


def parse_graph_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``; sizes must be positive."""
    sizes = parse_int_list(text)
    bad = [s for s in sizes if s <= 0]
    if bad:
        raise ValueError(f"batch sizes must be positive, got {bad}")
    return tuple(sorted(set(sizes)))


def parse_split_tokens(text: str) -> int:
    """Tokens per split of split-K decode attention: a positive multiple of 16."""
    value = int(text)
    if value <= 0 or value % 16:
        raise ValueError(f"expected a positive multiple of 16, got {value}")
    return value


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "CUDA_GRAPH_SIZES",
        parse_graph_sizes,
        None,
        "decode batch sizes to capture CUDA graphs for, e.g. 1,2,4,8 (default: 1,2,4,8,16,24,... up to max_num_seqs)",
    ),
    EnvVar(
        "GPU_MEMORY_UTILIZATION",
        parse_fraction,
        0.9,
        "fraction of GPU memory the engine may use (weights, activations, CUDA graphs and "
        "KV cache); when set it wins over the engine's gpu_memory_utilization setting",
    ),
    EnvVar(
        "CUDA_ATTENTION_BACKEND",
        str,
        "triton",
        "paged attention implementation: triton kernels or the torch reference (no CUDA graphs)",
        choices=("triton", "reference"),
    ),
    EnvVar(
        "CUDA_KERNELS",
        str,
        "triton",
        "norm / rotary / activation / KV-write implementation: triton kernels or the torch reference",
        choices=("triton", "reference"),
    ),
    EnvVar(
        "CUDA_SKINNY_GEMM",
        str,
        "cublas",
        "products of up to 4 rows (decode batches): cublas; auto times a Triton skinny kernel against "
        "cuBLAS per weight shape at start-up and keeps the faster (on an H200: +1.2% batch-1 decode, "
        "within noise); triton always",
        choices=("auto", "triton", "cublas"),
    ),
    EnvVar(
        "CUDA_DECODE_SPLIT_TOKENS",
        parse_split_tokens,
        256,
        "smallest number of context tokens one split of split-K decode attention handles",
    ),
)
