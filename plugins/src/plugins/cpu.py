"""The host-CPU family: :class:`CpuPlatform`, the base of every CPU backend.

It owns what all CPU backends share: the ``CPU_*`` variables (vLLM's names and
meanings, read as ``CORE_*`` with the ``VLLM_*`` spelling as a fallback), binding the
compute threads (``auto``, ``all``, ``nobind`` or one CPU list per rank), the CPUs
reserved for the front end and the thread placement of that front end, and the KV
budget. A backend subclass keeps only what is its own: ISA detection, kernels, runner.

The KV budget has one precedence rule, vLLM's: ``CPU_KVCACHE_SPACE`` wins when set
(> 0); else the engine's ``kv_cache_bytes``; else an automatic share of free memory.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, ClassVar

from plugins.config import EngineConfigView
from plugins.env import EnvVar
from plugins.host import first_sibling, numa_nodes, parse_cpu_list, process_cpus
from plugins.memory import GiB, MemoryProfiler
from plugins.platform import Platform

logger = logging.getLogger(__name__)

_BIND_KEYWORDS = ("auto", "all", "nobind")
#: with no CPU_KVCACHE_SPACE and no engine setting: this share of the memory free after
#: the weights (the rest is room for activations, a few hundred MB at 2048 tokens for the
#: models a CPU serves) ...
AUTO_KV_FRACTION = 0.4
#: ... capped at this many bytes (a small model seldom needs more)
AUTO_KV_CAP = 8 * GiB
#: the default step token budget is this many seconds of prefill: the most a long prompt
#: (or a burst of them) adds to a decoding request's inter-token latency, and about what a
#: short chat prompt (~150 tokens) takes, so one arriving alone is prefilled in one step ...
STEP_PREFILL_SECONDS = 0.3
#: ... at this prefill rate per compute core (prompt tokens/s): measured ~500 tok/s on two
#: AMD EPYC (Zen 1, AVX2) cores for the default model in float32 (issue 24); bigger models
#: prefill slower, so their steps take longer than the target
PREFILL_TOKENS_PER_S_PER_CORE = 250


def threads_bind(text: str) -> str:
    """Validate a ``CPU_OMP_THREADS_BIND`` value and return it normalized (lower case).

    Accepted: ``auto``, ``all``, ``nobind``, or one CPU list per rank separated by
    ``|``, e.g. ``0-31|32-63``.
    """
    value = text.strip().lower()
    if value in _BIND_KEYWORDS:
        return value
    for rank_list in value.split("|"):
        parse_cpu_list(rank_list)
    return value


def non_negative(parse):
    """An environment variable's parser: ``parse``, then ValueError below 0."""

    def check(text: str):
        value = parse(text)
        if value < 0:
            raise ValueError("must be >= 0")
        return value

    check.__name__ = f"non-negative {parse.__name__}"
    return check


#: The variables every CPU backend reads (subclasses add their own after these).
CPU_ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "CPU_KVCACHE_SPACE",
        non_negative(float),
        0.0,
        "KV cache size in GiB; when set it wins over the engine's kv_cache_bytes "
        f"(0: that setting, else min({AUTO_KV_CAP // GiB} GiB, {AUTO_KV_FRACTION:.0%} of free memory))",
    ),
    EnvVar(
        "CPU_OMP_THREADS_BIND",
        threads_bind,
        "auto",
        "CPUs for the compute threads: auto (the physical cores of one NUMA node per rank), all, "
        "nobind, or one list per rank like 0-31|32-63",
    ),
    EnvVar("CPU_NUM_OF_RESERVED_CPU", non_negative(int), 0, "cores kept free for the front end (auto binding)"),
)


@dataclass(frozen=True)
class CpuTopology:
    """The host's NUMA nodes (CPU lists) and each CPU's first hyper-thread sibling."""

    nodes: list[list[int]]
    first_sibling: dict[int, int]

    @classmethod
    def read(cls, cpus: list[int]) -> CpuTopology:
        """From sysfs, for ``cpus``."""
        return cls(numa_nodes(), {cpu: first_sibling(cpu) for cpu in cpus})

    def physical_cores(self, cpus: list[int]) -> list[int]:
        """One CPU per physical core among ``cpus`` (the first sibling present)."""
        keep = []
        for cpu in cpus:
            first = self.first_sibling.get(cpu, cpu)
            if first == cpu or first not in cpus:
                keep.append(cpu)
        return keep


def select_cpus(
    spec: str,
    allowed: list[int],
    rank: int = 0,
    num_reserved: int = 0,
    topology: CpuTopology | None = None,
    num_ranks: int = 1,
) -> list[int] | None:
    """The CPUs the compute threads of ``rank`` (of ``num_ranks`` on this machine) bind to,
    or None to leave them unbound.

    ``auto``: with no more ranks than NUMA nodes, the physical cores of node ``rank``
    (modulo the node count) that this process may use, minus the last ``num_reserved``
    (left to the front end); with more ranks than nodes, the physical cores of every
    node (in node order, minus the last ``num_reserved``) split into ``num_ranks`` equal
    contiguous parts. ``all``: every allowed CPU. ``nobind``: None. Otherwise one CPU
    list per rank, ``|``-separated.

    :param spec: a :func:`threads_bind`-normalized ``CPU_OMP_THREADS_BIND`` value.
    :param allowed: the CPUs this process may run on (see :func:`plugins.host.process_cpus`).
    :param topology: the host's topology (default: read from sysfs, for ``auto`` only).
    :raises ValueError: when the spec names no list for ``rank``, names CPUs outside
        ``allowed``, or the reserved CPUs leave no core.
    """
    if spec == "nobind":
        return None
    if spec == "all":
        return sorted(allowed)
    if spec == "auto":
        topology = topology or CpuTopology.read(allowed)
        nodes = [[c for c in node if c in allowed] for node in topology.nodes]
        nodes = [node for node in nodes if node] or [sorted(allowed)]
        if num_ranks <= len(nodes):
            cores = topology.physical_cores(nodes[rank % len(nodes)])
            chosen = cores[: len(cores) - num_reserved]
        else:
            cores = [core for node in nodes for core in topology.physical_cores(node)]
            share = (len(cores) - num_reserved) // num_ranks
            chosen = cores[rank * share : (rank + 1) * share]
        if not chosen:
            raise ValueError(
                f"CPU_OMP_THREADS_BIND=auto leaves rank {rank} of {num_ranks} no core "
                f"({len(cores)} cores {cores}, CPU_NUM_OF_RESERVED_CPU={num_reserved})"
            )
        return chosen
    per_rank = spec.split("|")
    if rank >= len(per_rank):
        raise ValueError(f"CPU_OMP_THREADS_BIND={spec!r} has {len(per_rank)} CPU list(s), none for rank {rank}")
    cpus = parse_cpu_list(per_rank[rank])
    outside = sorted(set(cpus) - set(allowed))
    if outside:
        raise ValueError(f"CPU_OMP_THREADS_BIND names CPUs {outside} this process may not use (allowed: {allowed})")
    return cpus


class CpuMemoryProfiler(MemoryProfiler):
    """Host memory; the KV budget follows the family's one precedence rule (module doc).

    Like vLLM's CPU backend it sizes the cache without a profile forward pass (that
    2048-token pass was half of the engine's start-up on a CPU), and it allocates the
    cache uninitialized.
    """

    needs_profile_run = False
    #: the variables (GiB) that set the budget, first set (> 0) wins; a backend puts its own first
    space_vars: ClassVar[tuple[str, ...]] = ("CPU_KVCACHE_SPACE",)

    def kv_cache_budget(self, config: EngineConfigView, peak_activation_bytes: int) -> tuple[int, str]:
        name, space = next(((n, self.platform.env[n]) for n in self.space_vars if self.platform.env[n] > 0), ("", 0))
        free = self.free_memory() - peak_activation_bytes
        if space > 0:
            budget = int(space * GiB)
            if budget > free:
                raise ValueError(
                    f"{name}={space} GiB exceeds the {free / GiB:.1f} GiB of memory free after the weights; lower it"
                )
            why = f"{name}={space} GiB"
        elif config.kv_cache_bytes:
            budget = int(config.kv_cache_bytes)
            why = f"{budget / GiB:.2f} GiB requested by the engine config"
        else:
            budget = max(0, min(AUTO_KV_CAP, int(free * AUTO_KV_FRACTION)))
            why = (
                f"auto: min({AUTO_KV_CAP / GiB:.0f} GiB, {AUTO_KV_FRACTION:.0%} of {free / GiB:.1f} GiB free); "
                "set CORE_CPU_KVCACHE_SPACE to choose"
            )
        logger.info("%s KV cache budget %.2f GiB (%s)", self.platform.name, budget / GiB, why)
        return budget, why

    def allocate_kv_cache(self, shape: tuple[int, ...], dtype: Any, device: Any) -> Any:
        """Uninitialized: attention reads only slots written before, and zeroing the
        default 8 GiB took 10-17 s of start-up (and made all of it resident at once); in
        transparent huge pages (:func:`plugins.hugepages.empty`): a decode step streams every
        cached block of its sequences (the default model at 1500 tokens of context, batch 1:
        1.06x with them, Zen 4)."""
        from plugins.hugepages import empty

        return empty(shape, dtype)


class CpuPlatform(Platform, abstract=True):
    """Base of the host-CPU backends: ``CPU_*`` variables, thread binding, KV budget.

    :meth:`init_device` pins the calling thread (the one that runs the model) and its
    compute threads to the CPUs :func:`select_cpus` chooses; :meth:`place_frontend_thread`
    pins the front end's thread to the CPUs left over. Subclasses set ``name``, add their
    variables after :data:`CPU_ENV_VARS` and may extend :meth:`bind_compute_threads`.
    """

    device_type = "cpu"
    priority = 10
    env_vars = CPU_ENV_VARS
    #: torch on the CPU has both float8 dtypes: the reference kernels (and the native ones) run
    #: them, and 16-bit caches under float32 compute (native/src/attention.cpp)
    supported_kv_cache_dtypes = ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2")

    def __init__(self) -> None:
        #: the CPUs the compute threads run on after :meth:`init_device` (None: not bound)
        self.compute_cpus: list[int] | None = None

    @property
    def frontend_cpus(self) -> list[int] | None:
        """The CPUs the front end runs on: those the compute binding left over (all the
        process may use when it took every one), or None before binding or with ``nobind``."""
        if self.compute_cpus is None:
            return None
        allowed = process_cpus()
        return [c for c in allowed if c not in self.compute_cpus] or allowed

    def make_memory_profiler(self):
        return CpuMemoryProfiler(self)

    def default_max_num_batched_tokens(self, config: EngineConfigView) -> int:
        """:data:`STEP_PREFILL_SECONDS` of prefill on the cores of one engine replica (its
        tensor-parallel ranks compute each step together, and each pipeline stage runs the whole
        step on its layers; rank 0's share, as :meth:`init_device` will bind it, times the
        tensor-parallel size), :data:`PREFILL_TOKENS_PER_S_PER_CORE` each, rounded up to a
        multiple of 16 and kept within [64, 2048]: 160 on 2 cores, 2048 from 28 up."""
        bind, reserved = self.env["CPU_OMP_THREADS_BIND"], self.env["CPU_NUM_OF_RESERVED_CPU"]
        num_ranks = config.world_size * config.data_parallel_size
        allowed = process_cpus()
        cpus = select_cpus(bind, allowed, 0, reserved, num_ranks=num_ranks)
        per_rank = len(cpus) if cpus is not None else max(1, len(allowed) // num_ranks)
        num_cores = per_rank * config.tensor_parallel_size
        tokens = STEP_PREFILL_SECONDS * PREFILL_TOKENS_PER_S_PER_CORE * num_cores
        return min(2048, max(64, -(-int(tokens) // 16) * 16))

    def init_device(self, config: EngineConfigView) -> None:
        """Bind the calling thread and the compute threads of ``config.local_rank`` (one of
        ``world_size x data_parallel_size`` ranks on this machine)."""
        bind, reserved = self.env["CPU_OMP_THREADS_BIND"], self.env["CPU_NUM_OF_RESERVED_CPU"]
        num_ranks = config.world_size * config.data_parallel_size
        cpus = select_cpus(bind, process_cpus(), config.local_rank, reserved, num_ranks=num_ranks)
        if cpus is None:
            logger.info("%s: compute threads not bound (CPU_OMP_THREADS_BIND=nobind)", self.name)
            return
        os.sched_setaffinity(0, cpus)
        detail = self.bind_compute_threads(cpus)
        self.compute_cpus = cpus
        logger.info(
            "%s: %d compute threads on CPUs %s (CPU_OMP_THREADS_BIND=%s, reserved %d, rank %d)%s; front end CPUs %s",
            self.name, len(cpus), cpus, bind, reserved, config.local_rank, detail, self.frontend_cpus,
        )  # fmt: skip

    def bind_compute_threads(self, cpus: list[int]) -> str:
        """(optional) override: start the compute threads on ``cpus`` (the calling thread is
        already pinned to them). Default: torch's thread pool sized to them.

        :return: a note for the start-up log (``""`` for none).
        """
        import torch

        torch.set_num_threads(len(cpus))
        return ""

    def place_frontend_thread(self) -> None:
        """Pin the calling (front-end) thread to :attr:`frontend_cpus`, if bound."""
        cpus = self.frontend_cpus
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
