"""The engine's settings, each declared once, and the frozen view plugins read.

Every setting is one field of :class:`EngineSettings` made by :func:`setting`: its name,
type (the annotation), default, help, command-line spellings and choices. From these
declarations come the ``core serve`` / ``core bench throughput`` flags (core derives them),
the settings check at resolution, :class:`EngineConfigView` (a subclass) and the SDK's test
config (:func:`plugins.reference.engine_config`): adding a setting is one field plus its use.

Core builds an :class:`EngineConfigView` once, before the engine exists, in stages:

1. the user's settings, validated (``dtype`` may still be ``"auto"`` and
   ``max_model_len`` may be ``None``): this is what ``Platform.check_config``
   receives; it returns overrides ``{field: value}`` that core merges with
   :func:`dataclasses.replace`;
2. core then resolves ``dtype``, ``kv_cache_dtype``, ``max_model_len`` and the scheduler
   budget (``max_num_batched_tokens``, the platform's default when the user set none); every
   later call (``init_device``, the memory profiler, ``Runner.prepare``) receives the
   fully resolved view: no ``"auto"``, no ``None`` ``max_model_len``.

Plugins read fields as attributes; the view never changes after it is built.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


DTYPES = ("auto", "float32", "bfloat16", "float16")
#: vLLM's other spellings (its s390x guide serves with ``--dtype float``)
DTYPE_ALIASES = {"float": "float32", "half": "float16"}
#: the values ``--kv-cache-dtype`` accepts (vLLM's; :mod:`plugins.kv_cache`), named here
#: without torch so that the CLI imports none
KV_CACHE_DTYPE_CHOICES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
#: ``fp8`` is E4M3, as in vLLM
KV_CACHE_DTYPE_ALIASES = {"fp8": "fp8_e4m3"}
#: ``int8`` (weight-only, at load), ``bf16`` (weights rounded to bfloat16 at load, products of
#: bfloat16-rounded activations summed in float32), ``gguf`` (kept as in the file), or the method a
#: Hugging Face checkpoint's ``quantization_config`` must have
QUANTIZATIONS = ("int8", "bf16", "gguf", "compressed-tensors", "gptq", "awq")
EXECUTOR_BACKENDS = ("mp", "ray")
#: grammar libraries of structured outputs (``auto``: llguidance)
STRUCTURED_OUTPUTS_BACKENDS = ("auto", "xgrammar", "guidance")
#: how thinking models mark their reasoning (``core.structured.reasoning``)
REASONING_PARSERS = ("deepseek_r1", "qwen3")
#: what the engine runs the model for (vLLM's ``--runner``): text generation, or pooling (embeddings,
#: scores, classes); ``auto`` picks from the checkpoint (pooling for encoders)
RUNNERS = ("auto", "generate", "pooling")


@dataclass(frozen=True)
class Setting:
    """How one engine setting is set: the metadata of its :class:`EngineSettings` field.

    :ivar help: one line for ``--help``, and the field's documentation.
    :ivar flags: the command-line spellings; empty: ``--`` and the field's name with dashes.
    :ivar choices: the values accepted (besides a ``None`` default), on the command line and
        at resolution.
    :ivar env: an environment variable, read as ``CORE_<env>`` (else ``VLLM_<env>``), that
        sets the flag's default (:class:`plugins.EnvVar`'s spelling and parsing).
    :ivar metavar: the value's name in ``--help``.
    :ivar parse: turns the flag's text into the value (default: the field's type).
    :ivar positional: also taken as the command's first positional argument (vLLM's
        ``serve MODEL``); the flag is then hidden from ``--help``.
    """

    help: str
    flags: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    env: str | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    positional: bool = False


def setting(default: Any, help: str, **how: Any) -> Any:
    """Declare a field of :class:`EngineSettings`: its default and help, plus any other
    :class:`Setting` key (``flags``, ``choices``, ``env``, ``metavar``, ``parse``, ``positional``)."""
    return dataclasses.field(default=default, metadata={"setting": Setting(help, **how)})


def declared_settings(cls: type) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of a settings dataclass made by :func:`setting`, with their metadata, in order."""
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata]


def json_object(text: str) -> dict[str, Any]:
    """``--speculative-config``: a JSON object (its keys are checked by core when the engine starts)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected a JSON object, got {text!r}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object, got {text!r}")
    return value


def gib(text: str) -> int | None:
    """``--kv-cache-memory``: a size in GiB (fractions allowed) as bytes; 0 leaves it unset."""
    size = float(text)
    return int(size * (1 << 30)) if size else None


@dataclass(frozen=True)
class EngineSettings:
    """The engine's settings, as the user gives them. Field names follow vLLM's engine arguments."""

    model: str | None = setting(
        None, "HF model directory, .gguf file or hub id (default: SmolLM2-135M-Instruct GGUF)", positional=True
    )
    device: str = setting("auto", "backend plugin name, or auto (highest-priority available)")
    runner: str = setting(
        "auto",
        "generate (text) or pooling (embeddings, scores, classes); auto: pooling for encoder checkpoints",
        choices=RUNNERS,
    )
    dtype: str = setting(
        "auto", "compute dtype; auto = the platform's first supported one", choices=(*DTYPES, *DTYPE_ALIASES)
    )
    quantization: str | None = setting(
        None,
        "int8 or bf16 (weights at load), gguf (kept as in the file), or the method a checkpoint must have "
        "(default: the checkpoint's own)",
        flags=("--quantization", "-q"),
        choices=QUANTIZATIONS,
    )
    max_model_len: int | None = setting(None, "longest sequence (prompt + output) in tokens (default: the model's)")
    max_num_seqs: int = setting(64, "most sequences running at once")
    max_num_batched_tokens: int | None = setting(
        None, "most new tokens per engine step (default: the platform's; 2048 unless it sets one)"
    )
    block_size: int = setting(16, "tokens per KV cache block")
    enable_prefix_caching: bool = setting(True, "share the KV blocks of equal prompt prefixes between requests")
    enable_chunked_prefill: bool = setting(True, "split long prompts over steps within the token budget")
    seed: int = setting(0, "seed of the random sampling")
    enforce_eager: bool = setting(False, "disable graph capture / compilation")
    kv_cache_bytes: int | None = setting(
        None,
        "KV cache size in GiB (default: the platform decides)",
        flags=("--kv-cache-memory",),
        metavar="GIB",
        parse=gib,
    )
    kv_cache_dtype: str = setting(
        "auto",
        "KV cache storage: auto = the compute dtype; float16 or bfloat16 (half a float32 cache's bytes); "
        "fp8 (= fp8_e4m3, per-layer scales) or fp8_e5m2: one byte",
        choices=KV_CACHE_DTYPE_CHOICES,
    )
    gpu_memory_utilization: float = setting(0.9, "share of the device's memory the engine may take")
    served_model_name: str | None = setting(None, "the model's name in the API (default: the model's)")
    tensor_parallel_size: int = setting(1, "ranks one model is split over", flags=("--tensor-parallel-size", "-tp"))
    pipeline_parallel_size: int = setting(
        1,
        "pipeline stages one model's layers are split over (each stage has tensor_parallel_size ranks)",
        flags=("--pipeline-parallel-size", "-pp"),
    )
    data_parallel_size: int = setting(1, "engine replicas behind one server", flags=("--data-parallel-size", "-dp"))
    distributed_executor_backend: str = setting(
        "mp", "how the workers of a split model run: processes or Ray actors", choices=EXECUTOR_BACKENDS
    )
    enable_lora: bool = setting(False, "serve LoRA adapters (a request's lora_request, the server's --lora-modules)")
    max_loras: int = setting(1, "most distinct LoRA adapters in one engine step")
    max_lora_rank: int = setting(16, "largest rank a LoRA adapter may have")
    max_cpu_loras: int | None = setting(
        None, "LoRA adapters kept loaded, the least recently used evicted beyond it (default: max_loras)"
    )
    structured_outputs_backend: str = setting(
        "auto",
        "grammar library of structured outputs: guidance (llguidance), xgrammar (pip install xgrammar), "
        "or auto (guidance)",
        choices=STRUCTURED_OUTPUTS_BACKENDS,
    )
    reasoning_parser: str | None = setting(
        None,
        "how the model marks its <think> reasoning: chat answers carry it in their reasoning field, and "
        "structured outputs constrain only what follows it",
        choices=REASONING_PARSERS,
    )
    speculative_config: dict[str, Any] | None = setting(
        None,
        'speculative decoding, vLLM\'s JSON: {"method": "ngram", "num_speculative_tokens": k, '
        '"prompt_lookup_min": a, "prompt_lookup_max": b} or {"method": "draft_model", "model": PATH, '
        '"num_speculative_tokens": k}',
        metavar="JSON",
        parse=json_object,
    )


@dataclass(frozen=True)
class EngineConfigView(EngineSettings):
    """The engine's settings as plugins see them: every :class:`EngineSettings` field (its
    help says what it holds), settled as the module says, and where this process runs.

    ``device`` is the chosen platform's name; ``kv_cache_bytes`` is in bytes. Resolved,
    ``dtype`` is one of the platform's ``supported_dtypes`` and ``kv_cache_dtype`` one of its
    ``supported_kv_cache_dtypes`` or the compute dtype's name (for ``auto``).

    :ivar rank: this process's global rank: ``data_parallel_rank * world_size`` plus its rank
        within its replica, ``pipeline_rank * tensor_parallel_size + tensor_parallel_rank``.
    :ivar local_rank: this process's rank on its own machine.
    """

    rank: int = 0
    local_rank: int = 0

    @property
    def world_size(self) -> int:
        """Number of workers one model is split over (tensor x pipeline parallel size)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The resolved KV cache dtype as a ``torch.dtype``.

        :raises ValueError: before resolution (``auto``, ``fp8``).
        """
        from plugins.kv_cache import kv_torch_dtype

        return kv_torch_dtype(self.kv_cache_dtype)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The resolved compute dtype as a ``torch.dtype``.

        :raises ValueError: while ``dtype`` is still ``"auto"`` (before resolution).
        """
        import torch

        if self.dtype == "auto":
            raise ValueError("dtype is not resolved yet ('auto'); torch_dtype is valid only after resolution")
        return getattr(torch, self.dtype)
