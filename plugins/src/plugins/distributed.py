"""Collectives among the ranks that share one model (tensor parallelism), and the hand-off
between pipeline stages.

:class:`Communicator` is the SDK default: ``torch.distributed`` all-reduce, all-gather and
point-to-point send/recv over the platform's :attr:`plugins.Platform.distributed_backend`
(gloo for the CPU plugins, nccl for cuda/rocm, ...). A platform with a faster path (a
shared-memory all-reduce, a vendor library) returns a subclass from
:meth:`plugins.Platform.make_communicator`; the conformance kit checks it with two
processes (:func:`check_communicator`).

One process may hold two communicators over parts of the same process group: under
``tensor x pipeline`` parallelism a rank all-reduces with the ranks of its stage and sends
to the next stage's rank of its own tensor-parallel place (``ranks`` says which).
"""

from __future__ import annotations

import datetime
import logging
import os
import pickle
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


#: names the node a rank runs on beside its host: core's Ray executor sets it to the rank's Ray
#: node id, so that ranks on two Ray nodes started on one machine count as on two hosts
NODE_ID_ENV = "CORE_NODE_ID"


def host_id() -> tuple[str, str, str]:
    """What tells this rank's host from the other ranks': its host name, its kernel's boot id,
    and the node id of :data:`NODE_ID_ENV` (empty when unset). Ranks with equal ids may share
    memory."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return socket.gethostname(), boot.read_text().strip() if boot.exists() else "", os.environ.get(NODE_ID_ENV, "")


def free_tcp_address(host: str = "127.0.0.1") -> str:
    """A ``tcp://host:port`` init address on a port that is free now (for local process groups)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"tcp://{host}:{s.getsockname()[1]}"


class Communicator:
    """Sum, gather, send and receive tensors among ranks through ``torch.distributed``.

    Every rank constructs one with the same ``init_method`` and ``world_size`` and its
    own ``rank``; the constructor returns once all ranks (of ``ranks``) have joined. The
    first communicator of a process joins the process group of all ``world_size`` ranks;
    a second one (with other ``ranks``) shares it.

    :param backend: the ``torch.distributed`` backend name (``"gloo"``, ``"nccl"``, ...).
    :param rank: this process's rank in the process group, ``0 <= rank < world_size``.
    :param world_size: number of ranks in the process group.
    :param init_method: rendezvous address every rank uses, e.g. ``tcp://127.0.0.1:29500``.
    :param timeout_s: how long a collective may wait for the other ranks before it raises.
    :param ranks: the process-group ranks this communicator spans, ``rank`` among them (default:
        all). Its :attr:`rank` and :attr:`world_size`, and the ranks :meth:`send` and :meth:`recv`
        name, are then places in ``ranks``.
    """

    def __init__(
        self,
        backend: str,
        rank: int,
        world_size: int,
        init_method: str,
        timeout_s: float = 600.0,
        ranks: Sequence[int] | None = None,
    ) -> None:
        import torch.distributed as dist

        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside [0, {world_size})")
        members = list(range(world_size) if ranks is None else ranks)
        if rank not in members or len(set(members)) != len(members) or not all(0 <= r < world_size for r in members):
            raise ValueError(f"ranks {members} must be distinct ranks of [0, {world_size}) including rank {rank}")
        timeout = datetime.timedelta(seconds=timeout_s)
        #: whether this communicator joined the process group (then :meth:`close` leaves it)
        self.owns_group = not dist.is_initialized()
        if self.owns_group:
            dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size, timeout=timeout)
            logger.info("rank %d/%d joined the %s process group at %s", rank, world_size, backend, init_method)
        elif (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(
                f"this process is rank {dist.get_rank()} of {dist.get_world_size()} already, not {rank} of {world_size}"
            )
        #: the ``torch.distributed`` group of ``ranks``; None: the whole process group
        self.group = None
        if len(members) < world_size:
            self.group = dist.new_group(members, timeout=timeout, backend=backend, use_local_synchronization=True)
        self.ranks = members
        self.rank = members.index(rank)
        self.world_size = len(members)
        self.backend = backend

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over all ranks, in place; returns it."""
        import torch.distributed as dist

        dist.all_reduce(tensor, group=self.group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` (same shape on all ranks) along ``dim``, in rank order."""
        import torch
        import torch.distributed as dist

        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def send(self, tensor: torch.Tensor, dst: int) -> Callable[[], None]:
        """Start sending contiguous ``tensor`` to rank ``dst``, which receives it with :meth:`recv`
        (a tensor of the same shape and dtype); messages between two ranks arrive in order.

        :return: a function that returns once the tensor has gone; ``tensor`` must stay
            unchanged until then.
        """
        import torch.distributed as dist

        return dist.isend(tensor, group=self.group, group_dst=dst).wait

    def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Receive into ``tensor`` what rank ``src`` sent with :meth:`send`; returns ``tensor``."""
        import torch.distributed as dist

        dist.recv(tensor, group=self.group, group_src=src)
        return tensor

    def abort(self) -> None:
        """Called from another thread of this process when a peer rank has died: make this rank's
        waiting and later collectives raise rather than wait for it. Default: nothing, as gloo's
        collectives already raise when a peer's connection closes; a communicator whose ranks
        wait on shared memory overrides it.
        """

    def close(self) -> None:
        """Leave this communicator's group, and the process group if this communicator joined
        it (idempotent; close a process's other communicators first)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            return
        if self.owns_group:
            dist.destroy_process_group()
        elif self.group is not None:
            dist.destroy_process_group(self.group)
        self.group = None


def _class_ref(cls: type) -> tuple[str, str | None, str]:
    """What a spawned process needs to import ``cls``: module name, its file, qualified name."""
    import sys

    return cls.__module__, getattr(sys.modules[cls.__module__], "__file__", None), cls.__qualname__


def _import_class(ref: tuple[str, str | None, str]) -> type:
    """The class of :func:`_class_ref`, by module name or else from its file (test modules
    that pytest imported under a name the child cannot import)."""
    import importlib
    import importlib.util

    module_name, file, qualname = ref
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        if file is None:
            raise
        spec = importlib.util.spec_from_file_location(f"_kit_{module_name.replace('.', '_')}", file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    obj: Any = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


#: the tensors :func:`check_communicator` sums and gathers: a small odd shape, one token's hidden
#: state of a small model, and 2.4 MB (float32) that a communicator with a buffer of its own may
#: have to pass in pieces; one after another, as the layers of a step call them
CHECK_SHAPES = ((5, 33), (1, 576), (2, 300_000))


def _check_rank(
    platform_ref: tuple[str, str | None, str], rank: int, world_size: int, init_method: str, results: Any
) -> None:
    """One rank of :func:`check_communicator` (module level, so ``spawn`` can pickle it)."""
    import torch

    try:
        platform = _import_class(platform_ref)()
        device = platform.torch_device()
        comm = platform.make_communicator(rank, world_size, init_method)
        try:
            report = {}
            for dtype in (torch.float32, torch.bfloat16):
                for shape in CHECK_SHAPES:
                    gen = torch.Generator().manual_seed(1000 + rank)
                    x = torch.randn(*shape, generator=gen).to(dtype)
                    summed = comm.all_reduce(x.clone().to(device)).cpu()
                    gathered = comm.all_gather(x.to(device), dim=-1).cpu()
                    sent, received = x.to(device), torch.empty_like(x, device=device)
                    wait = comm.send(sent, (rank + 1) % world_size)  # a ring: each rank sends, then receives
                    comm.recv(received, (rank - 1) % world_size)
                    wait()
                    report[f"{dtype} {list(shape)}"] = (x, summed, gathered, received.cpu())
        finally:
            comm.close()
        # plain pickle bytes: torch's queue reduction would share memory the exiting child frees
        results.put((rank, pickle.dumps(report), None))
    except Exception as exc:  # reported to the parent, which fails the check with it
        results.put((rank, None, f"{type(exc).__name__}: {exc}"))


def check_communicator(platform_class: type, world_size: int = 2, timeout_s: float = 120.0) -> None:
    """Run a platform's communicator in ``world_size`` fresh processes and check its results.

    Each rank all-reduces and all-gathers its own random tensors (float32 and bfloat16, of
    each of :data:`CHECK_SHAPES`), and sends them to the next rank (round a ring); the sums
    must match the float32 sum of every rank's inputs, the gather their concatenation in
    rank order, and what a rank received the previous rank's input.

    :raises AssertionError: naming the rank, dtype, shape and op that gave a wrong result, a
        rank's exception, or the ranks that did not answer within ``timeout_s``.
    """
    import multiprocessing
    import queue

    import torch

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    address = free_tcp_address()
    procs = [
        ctx.Process(target=_check_rank, args=(_class_ref(platform_class), r, world_size, address, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    reports: dict[int, Any] = {}
    try:
        for _ in range(world_size):
            rank, report, error = results.get(timeout=timeout_s)
            assert error is None, f"communicator of {platform_class.__name__}, rank {rank}: {error}"
            reports[rank] = pickle.loads(report)
    except queue.Empty:
        missing = sorted(set(range(world_size)) - set(reports))
        raise AssertionError(f"communicator ranks {missing} did not answer within {timeout_s:.0f} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    for dtype in reports[0]:
        inputs = [reports[r][dtype][0] for r in range(world_size)]
        expected_sum = sum(x.float() for x in inputs)
        expected_gather = torch.cat(inputs, dim=-1)
        tol = 1e-5 if dtype.startswith("torch.float32") else 2e-2
        for rank in range(world_size):
            _, summed, gathered, received = reports[rank][dtype]
            assert torch.allclose(summed.float(), expected_sum, rtol=tol, atol=tol), (
                f"all_reduce on rank {rank} ({dtype}) differs from the sum of the ranks' inputs"
            )
            assert torch.equal(gathered, expected_gather), (
                f"all_gather on rank {rank} ({dtype}) is not the ranks' inputs in rank order"
            )
            assert torch.equal(received, inputs[(rank - 1) % world_size]), (
                f"recv on rank {rank} ({dtype}) is not what rank {(rank - 1) % world_size} sent"
            )
