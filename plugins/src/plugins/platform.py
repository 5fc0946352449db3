"""The one interface a backend implements: :class:`Platform`.

A backend must give four members: :attr:`Platform.name`, :attr:`Platform.device_type`,
:attr:`Platform.priority` and its availability, :meth:`Platform.unavailable_reason` (None
when the machine can run it) or :meth:`Platform.is_available`. A class that lacks one fails
as it is created, naming them. Everything else has a correct, device-neutral default: the
torch reference kernels, eager execution and a host-memory profiler. Override what the
device does better; members are grouped below as in ``plugins/README.md``'s backend contract.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from plugins.config import EngineConfigView
from plugins.env import EnvVar, read_env

#: Version of this interface. A plugin may set ``Platform.api_version`` to the version
#: it was written for; the engine rejects a mismatch naming both numbers.
#: 2: availability is ``unavailable_reason()``; the engine passes a typed
#: :class:`plugins.EngineConfigView`; the runner is stateful (``prepare`` binds the model
#: and caches, ``execute(inputs)`` runs on them); ``place_frontend_thread()`` replaces the
#: ``frontend_cpus`` extension.
PLATFORM_API_VERSION = 2

#: the class attributes every concrete platform sets (its availability is the fourth member)
REQUIRED_ATTRIBUTES = ("name", "device_type", "priority")


class Platform:
    """A hardware backend. Subclass it; instances are created with no arguments.

    A subclass meant as a base for other platforms, which leaves required members to them,
    says so with ``class CpuPlatform(Platform, abstract=True)``.
    """

    # -- required ----------------------------------------------------------------------
    #: what ``--device`` takes, e.g. ``"cpu_x86"``
    name: ClassVar[str]
    #: the torch device type tensors live on: ``"cpu"``, ``"cuda"``, ``"mps"``, ``"hpu"``, ...
    device_type: ClassVar[str]
    #: ``--device auto`` picks the available platform with the highest priority
    priority: ClassVar[int]

    def __init_subclass__(cls, abstract: bool = False, **kwargs: Any) -> None:
        """Check a platform class as it is created: unless ``abstract``, it gives every required member.

        :raises TypeError: naming the class and the required members it lacks.
        """
        super().__init_subclass__(**kwargs)
        missing = [] if abstract else missing_members(cls)
        if missing:
            raise TypeError(
                f"{cls.__qualname__} lacks {', '.join(missing)}: members every plugins.Platform gives "
                "(plugins/README.md, 'The backend contract'); a base class for platforms says abstract=True"
            )

    def unavailable_reason(self) -> str | None:
        """Why this machine cannot run the platform, in a few words, or None when it can.

        What a backend implements (e.g. ``"no NVIDIA device found"``), or else
        :meth:`is_available`. Must be cheap (no device initialisation, no heavy import) and
        never raise. For a platform that overrides only :meth:`is_available`: its answer.
        """
        if type(self).is_available is not Platform.is_available:
            return None if self.is_available() else "is_available() returned False"
        return None

    def is_available(self) -> bool:
        """Whether this machine can run the platform: :meth:`unavailable_reason` is None."""
        return self.unavailable_reason() is None

    # -- version (stated by every first-party plugin) ---------------------------------
    #: the :data:`PLATFORM_API_VERSION` this platform was written for, as a number (None: current)
    api_version: ClassVar[int | None] = None

    # -- capabilities (optional) -----------------------------------------------------
    #: compute dtypes the platform runs, best first; the first is the ``auto`` dtype
    supported_dtypes: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16")
    #: KV cache dtypes (``"bfloat16"``, ``"float16"``, the one-byte ``"fp8_e4m3"`` and
    #: ``"fp8_e5m2"``, see :mod:`plugins.kv_cache`) the platform's ``write_kv_cache`` and
    #: ``paged_attention`` store and read, besides the compute dtype (``--kv-cache-dtype
    #: auto``, always supported). The SDK's torch reference kernels handle all four on
    #: devices where torch has the float8 dtypes; declare only what the conformance kit
    #: passes on the device (it checks each one declared)
    supported_kv_cache_dtypes: ClassVar[tuple[str, ...]] = ()
    #: the byte order of numbers in the platform's tensors: ``"little"``, or ``"big"`` for a
    #: big-endian host (s390x). The loader converts the little-endian bytes it reads from
    #: GGUF files to it (:func:`plugins.byteorder.to_host_order`)
    byte_order: ClassVar[str] = "little"

    # -- configuration (optional) ----------------------------------------------------
    #: environment variables the platform reads (see :class:`plugins.EnvVar`)
    env_vars: ClassVar[tuple[EnvVar, ...]] = ()

    @functools.cached_property
    def env(self) -> dict[str, Any]:
        """The parsed values of :attr:`env_vars`, ``{name: value}``, read once.

        :raises plugins.EnvConfigError: naming the first variable with a bad value.
        """
        return read_env(self.env_vars)

    def read_env(self, environ: Mapping[str, str]) -> dict[str, Any]:
        """Parse :attr:`env_vars` from ``environ`` (the conformance kit and backend tests pass their own)."""
        return read_env(self.env_vars, environ)

    def check_config(self, config: EngineConfigView) -> dict[str, Any]:
        """(optional) override: adjust or reject the user's settings.

        :param config: the validated settings before resolution (``dtype`` may be
            ``"auto"``, ``max_model_len`` None); read fields as attributes.
        :return: overrides ``{field: value}`` the engine merges, validates and logs.
        :raises ValueError: a setting the platform cannot run, with the reason.
        """
        return {}

    def default_max_num_batched_tokens(self, config: EngineConfigView) -> int:
        """(optional) override: the scheduler's token budget per step when the user set none
        (``--max-num-batched-tokens``). A step's time grows with its tokens, and a decoding
        request waits for a whole step per token, so a slow device wants a smaller budget.
        Default: 2048 (vLLM's for serving).

        :param config: the settings after :meth:`check_config` (``max_num_batched_tokens`` None).
        """
        return 2048

    # -- device set-up (optional) ----------------------------------------------------
    def init_device(self, config: EngineConfigView) -> None:
        """(optional) override: device set-up once this platform is chosen (thread binding,
        device selection). Heavy imports belong here, not at import.

        Called once per process, in the thread that will run the model (thread affinity
        is per thread on Linux), with the fully resolved config."""

    def place_frontend_thread(self) -> None:
        """(optional) override: place the calling front-end thread (the HTTP server's event
        loop) so that it does not compete with the compute threads. Called by the engine
        in that thread after :meth:`init_device`. Default: nothing."""

    def device_info(self) -> dict[str, Any]:
        """(optional) override: facts for ``core devices`` (name, count, memory, ISA flags)."""
        return {}

    def torch_device(self):
        """The ``torch.device`` tensors are placed on (default: ``device_type``)."""
        import torch

        return torch.device(self.device_type)

    def synchronize(self) -> None:
        """(optional) override: wait for queued device work (used by timing and profiling)."""

    # -- compute: kernels, memory, execution (optional) ------------------------------
    @functools.cached_property
    def kernels(self):
        """The kernel set (:class:`plugins.kernels.Kernels`). Override :meth:`make_kernels`."""
        return self.make_kernels()

    def make_kernels(self):
        """(optional) override to return a :class:`plugins.kernels.Kernels` subclass instance
        (each op with the reference's signature: the conformance kit checks it)."""
        from plugins.kernels import Kernels

        return Kernels()

    @functools.cached_property
    def memory(self):
        """The memory profiler (:class:`plugins.memory.MemoryProfiler`)."""
        return self.make_memory_profiler()

    def make_memory_profiler(self):
        """(optional) override to return a :class:`plugins.memory.MemoryProfiler` subclass."""
        from plugins.memory import MemoryProfiler

        return MemoryProfiler(self)

    @functools.cached_property
    def runner(self):
        """The execution strategy (:class:`plugins.runner.Runner`)."""
        return self.make_runner()

    def make_runner(self):
        """(optional) override to return a :class:`plugins.runner.Runner` subclass instance."""
        from plugins.runner import Runner

        return Runner(self)

    def kv_cache_layout(self, config: EngineConfigView, num_kv_heads: int, head_size: int):
        """(optional) override: how one layer's KV cache is laid out, and so the bytes a block takes.

        :param config: the resolved settings (``block_size``, ``kv_cache_dtype``).
        :param num_kv_heads: the KV heads of one layer on this rank; ``head_size`` their size.
        :return: a :class:`plugins.kv_cache.KVCacheLayout`. Default:
            :meth:`KVCacheLayout.standard` at ``config.block_size`` in ``config.kv_torch_dtype``,
            what the SDK's kernels read. Another layout (one-byte codes with per-token scales)
            is for a runner that reads the caches itself: the engine sizes the KV cache by its
            :attr:`~plugins.kv_cache.KVCacheLayout.block_bytes` and never reads its contents.
        """
        from plugins.kv_cache import KVCacheLayout

        return KVCacheLayout.standard(config.block_size, num_kv_heads, head_size, config.kv_torch_dtype)

    # -- distributed (optional) ------------------------------------------------------
    #: ``torch.distributed`` backend for multi-device (tensor-parallel) runs
    distributed_backend: ClassVar[str] = "gloo"
    #: the Ray resource one rank reserves under ``--distributed-executor-backend ray``: ``"CPU"``,
    #: ``"GPU"`` (CUDA, ROCm) or the vendor's key (``"TPU"``, ``"HPU"``, ``"neuron_cores"``)
    ray_device_key: ClassVar[str] = "CPU"

    def make_communicator(self, rank: int, world_size: int, init_method: str, ranks: Sequence[int] | None = None):
        """(optional) override: the collectives of one rank of a split model on this platform.

        Called in each rank's process after :meth:`init_device`: once for tensor parallelism
        alone; under pipeline parallelism once per group the rank is in, with ``ranks`` (the
        ranks of its stage, to all-reduce with; the ranks of its place in every stage, to
        send and receive hidden states), which the communicator takes as its own ``ranks``.

        :param rank: this process's rank, ``0 <= rank < world_size``.
        :param world_size: number of ranks one model is split over.
        :param init_method: rendezvous address shared by every rank (``tcp://host:port``).
        :param ranks: the ranks the communicator spans (None: all ``world_size``).
        :return: a :class:`plugins.distributed.Communicator` (default: ``torch.distributed``
            over :attr:`distributed_backend`); a subclass may bring a faster all-reduce.
        """
        from plugins.distributed import Communicator

        return Communicator(self.distributed_backend, rank, world_size, init_method, ranks=ranks)

    # -- observability and device-specific extras (optional) -------------------------
    def metrics(self) -> dict[str, float]:
        """(optional) override: the platform's own gauges ``{name: value}`` (e.g. graphs
        compiled so far); the server's ``/metrics`` shows each as ``core:platform_<name>``.
        Called after every engine step: must be cheap."""
        return {}

    def get_extension(self, name: str) -> Any | None:
        """(optional) override: a device-specific extra by name, or None where the platform has none.

        The escape hatch for what is not part of the shared interface, so the interface does
        not grow one device's methods: tools ask for a name and handle None. The CPU plugins
        with native kernels answer ``"kernel_isa"`` (the ISA variant their kernels run).
        """
        return None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device_type={self.device_type!r}>"


def missing_members(cls: type[Platform]) -> list[str]:
    """The required members ``cls`` lacks: unset :data:`REQUIRED_ATTRIBUTES`, and its availability
    when it overrides neither :meth:`Platform.unavailable_reason` nor :meth:`Platform.is_available`."""
    missing = [attr for attr in REQUIRED_ATTRIBUTES if getattr(cls, attr, None) is None]
    if cls.unavailable_reason is Platform.unavailable_reason and cls.is_available is Platform.is_available:
        missing.append("unavailable_reason() (or is_available())")
    return missing
