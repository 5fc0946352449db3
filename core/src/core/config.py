"""The user's engine settings: one dataclass, shared by the CLI, the server and ``LLM``.

They are validated and settled (platform overrides, dtype, lengths) once, by
:func:`core.resolve.resolve_engine`, into the read-only :class:`plugins.EngineConfigView`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from plugins import Platform
from plugins.config import KV_CACHE_DTYPE_CHOICES

DTYPES = ("auto", "float32", "bfloat16", "float16")
EXECUTOR_BACKENDS = ("mp", "ray")
#: vLLM's other spellings (its s390x guide serves with ``--dtype float``)
DTYPE_ALIASES = {"float": "float32", "half": "float16"}


@dataclass
class EngineConfig:
    """Settings of one engine. Field names follow vLLM's engine arguments."""

    model: str | None = None  # HF directory, .gguf file or hub id; None = the default model
    device: str | Platform | type[Platform] = "auto"  # a plugin name, "auto", or a Platform (class or instance)
    dtype: str = "auto"  # auto = the platform's first supported dtype
    # None (the checkpoint's own), "int8" (weight-only), "gguf" (kept as in the file), or a HF checkpoint's
    # quantization_config method to insist on: "compressed-tensors", "gptq", "awq"
    quantization: str | None = None
    max_model_len: int | None = None  # None = the model's own limit
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None  # new tokens per step; None = the platform's default
    block_size: int = 16
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0
    enforce_eager: bool = False
    kv_cache_bytes: int | None = None  # KV cache size; None = the platform's memory profiler decides
    kv_cache_dtype: str = "auto"  # auto = the compute dtype; bfloat16, float16; fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2
    gpu_memory_utilization: float = 0.9
    served_model_name: str | None = None
    tensor_parallel_size: int = 1  # ranks one model is split over
    data_parallel_size: int = 1  # engine replicas behind one server
    distributed_executor_backend: str = "mp"  # how tensor-parallel workers run: "mp" or "ray"


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add vLLM's engine flags to ``parser``."""
    d = EngineConfig()
    parser.add_argument(
        "model",
        nargs="?",
        default=None,
        help="HF model directory, .gguf file or hub id (default: SmolLM2-135M-Instruct GGUF)",
    )
    parser.add_argument("--model", dest="model_flag", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default=d.device, help="backend plugin name, or auto (highest-priority available)")
    parser.add_argument("--dtype", default=d.dtype, choices=(*DTYPES, *DTYPE_ALIASES))
    parser.add_argument(
        "--quantization", "-q", default=None, choices=("int8", "gguf", "compressed-tensors", "gptq", "awq")
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=d.max_num_batched_tokens,
        help="most new tokens per engine step (default: the platform's; 2048 unless it sets one)",
    )
    parser.add_argument("--block-size", type=int, default=d.block_size)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching
    )
    parser.add_argument(
        "--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=d.enable_chunked_prefill
    )
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--enforce-eager", action="store_true", help="disable graph capture / compilation")
    parser.add_argument(
        "--kv-cache-memory",
        type=float,
        default=None,
        metavar="GIB",
        help="KV cache size in GiB (default: the platform decides)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default=d.kv_cache_dtype,
        choices=KV_CACHE_DTYPE_CHOICES,
        help="KV cache storage: auto = the compute dtype; float16 or bfloat16 (half a float32 cache's bytes); "
        "fp8 (= fp8_e4m3, per-layer scales) or fp8_e5m2: one byte",
    )
    parser.add_argument("--gpu-memory-utilization", type=float, default=d.gpu_memory_utilization)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=d.tensor_parallel_size)
    parser.add_argument("--data-parallel-size", "-dp", type=int, default=d.data_parallel_size)
    parser.add_argument(
        "--distributed-executor-backend", default=d.distributed_executor_backend, choices=EXECUTOR_BACKENDS
    )


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build an :class:`EngineConfig` from parsed :func:`add_engine_args` flags."""
    config = EngineConfig(
        model=args.model or args.model_flag,
        device=args.device,
        dtype=args.dtype,
        quantization=args.quantization,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        seed=args.seed,
        enforce_eager=args.enforce_eager,
        kv_cache_bytes=int(args.kv_cache_memory * (1 << 30)) if args.kv_cache_memory else None,
        kv_cache_dtype=args.kv_cache_dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        served_model_name=args.served_model_name,
        tensor_parallel_size=args.tensor_parallel_size,
        data_parallel_size=args.data_parallel_size,
        distributed_executor_backend=args.distributed_executor_backend,
    )
    return config
