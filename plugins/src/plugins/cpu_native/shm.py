""":class:`SharedMemoryCommunicator`: the CPU plugins' collectives between the ranks of one host.

gloo over TCP takes milliseconds for an all-reduce of one token's hidden state between two
processes, and a tensor-parallel decode step makes two a layer. Ranks on one host instead
share a buffer (a file in ``/dev/shm`` that each maps) with a flag per rank: a rank copies
its part in, publishes, waits for the others' flags and sums (native/src/shm_comm.cpp).
The fused native decoder calls that all-reduce inside its layer loop
(:attr:`SharedMemoryCommunicator.native_all_reduce`). Ranks on several hosts keep gloo.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import tempfile
from collections.abc import Sequence
from ctypes import c_double, c_int, c_long, c_void_p
from typing import Any

import torch
import torch.distributed as dist
from plugins.cpu_native.library import DTYPE_BF16, DTYPE_F32
from plugins.distributed import Communicator, host_id

logger = logging.getLogger(__name__)

#: bytes of each rank's slot in the shared buffer; a larger tensor goes through in pieces of this size
SLOT_BYTES = 1 << 20
#: where the shared buffer's file is made (a tmpfs on Linux)
SHM_DIR = "/dev/shm"
_CODES = {torch.float32: DTYPE_F32, torch.bfloat16: DTYPE_BF16}


class SharedMemoryCommunicator(Communicator):
    """A :class:`plugins.distributed.Communicator` whose all-reduce (float32, bfloat16) and
    all-gather of CPU tensors go through a buffer the ranks share, when every rank runs on
    this host; other tensors, and ranks on several hosts, go through gloo (the base class,
    whose process group also does the rendezvous).

    Sums run in float32 in rank order on every rank, so every rank gets the same bits.

    :param lib: the kernel library (:class:`plugins.cpu_native.library.NativeLib`).
    :param rank: this process's rank, ``0 <= rank < world_size``.
    :param world_size: number of ranks.
    :param init_method: rendezvous address every rank uses (``tcp://host:port``).
    :param slot_bytes: each rank's slot (a multiple of 64); larger tensors go in pieces.
    :param timeout_s: how long a collective waits for the other ranks before it raises.
    :param ranks: the ranks it spans (:class:`plugins.distributed.Communicator`); send and recv
        go through gloo.
    """

    def __init__(
        self,
        lib: Any,
        rank: int,
        world_size: int,
        init_method: str,
        slot_bytes: int = SLOT_BYTES,
        timeout_s: float = 600.0,
        ranks: Sequence[int] | None = None,
    ) -> None:
        if slot_bytes <= 0 or slot_bytes % 64:
            raise ValueError(f"slot_bytes must be a positive multiple of 64, got {slot_bytes}")
        super().__init__("gloo", rank, world_size, init_method, timeout_s, ranks)
        self.timeout_s = timeout_s
        self._ctx: int | None = None
        self._mmap: mmap.mmap | None = None
        self._anchor: ctypes.c_char | None = None
        cdll = lib.cdll
        for name, restype, argtypes in (
            ("ck_shm_size", c_long, [c_int, c_long]),
            ("ck_shm_open", c_void_p, [c_void_p, c_int, c_int, c_long, c_double]),
            ("ck_shm_close", None, [c_void_p]),
            ("ck_shm_abort", None, [c_void_p]),
            ("ck_shm_all_reduce", c_int, [c_void_p, c_void_p, c_long, c_int]),
            ("ck_shm_all_gather", c_int, [c_void_p, c_void_p, c_long, c_void_p]),
        ):
            fn = getattr(cdll, name)
            fn.restype, fn.argtypes = restype, argtypes
        self._lib = cdll
        hosts: list[Any] = [None] * self.world_size
        dist.all_gather_object(hosts, host_id(), group=self.group)
        if len(set(hosts)) > 1:
            logger.info(
                "rank %d: the %d ranks are on %d hosts: collectives over gloo", rank, self.world_size, len(set(hosts))
            )
            return
        error = self._map(cdll.ck_shm_size(self.world_size, slot_bytes), slot_bytes)
        errors: list[Any] = [None] * self.world_size
        dist.all_gather_object(errors, error, group=self.group)
        if any(errors):  # every rank must take the same path
            logger.warning(
                "rank %d: no shared buffer (%s): collectives over gloo", rank, "; ".join(filter(None, errors))
            )
            self._unmap()
            return
        logger.info(
            "rank %d/%d: collectives through a %d KiB shared buffer", rank, self.world_size, len(self._mmap) >> 10
        )

    def _map(self, size: int, slot_bytes: int) -> str | None:
        """Rank 0 makes the buffer's file, every rank maps it, then it is unlinked (no file
        outlives the ranks). Returns why this rank could not map it, or None."""
        names: list[str | None] = [None]
        if self.rank == 0:
            try:
                fd, names[0] = tempfile.mkstemp(prefix="core-tp-", dir=SHM_DIR)
                os.ftruncate(fd, size)
                os.close(fd)
            except OSError as exc:
                logger.warning("rank 0: cannot make a shared buffer in %s: %s", SHM_DIR, exc)
        dist.broadcast_object_list(names, group=self.group, group_src=0)
        if names[0] is None:
            return f"rank 0 could not make a file in {SHM_DIR}"
        try:
            with open(names[0], "r+b") as f:
                self._mmap = mmap.mmap(f.fileno(), size)
        except OSError as exc:
            return f"rank {self.rank}: {exc}"
        finally:
            dist.barrier(group=self.group)  # every rank has mapped it, or failed to
            if self.rank == 0:
                os.unlink(names[0])
        self._anchor = ctypes.c_char.from_buffer(self._mmap)
        self._ctx = self._lib.ck_shm_open(
            ctypes.addressof(self._anchor), self.rank, self.world_size, slot_bytes, self.timeout_s
        )
        return None if self._ctx else f"rank {self.rank}: cannot allocate its handle"

    @property
    def is_shared(self) -> bool:
        """Whether collectives go through the shared buffer (every rank on this host)."""
        return self._ctx is not None

    @property
    def native_all_reduce(self) -> tuple[int, int] | None:
        """``(function, handle)`` for native callers: ``int function(handle, buf, count, dtype)``
        sums ``count`` elements of ``buf`` (dtype code 0 float32, 1 bfloat16) over the ranks in
        place and returns nonzero on failure; None when the ranks do not share the buffer."""
        if self._ctx is None:
            return None
        return ctypes.cast(self._lib.ck_shm_all_reduce, c_void_p).value, self._ctx

    def _check(self, status: int, op: str) -> None:
        if status > self.world_size:
            raise RuntimeError(f"{op} on rank {self.rank}: aborted waiting for rank {status - 1 - self.world_size}")
        if status:
            raise RuntimeError(
                f"{op} on rank {self.rank}: rank {status - 1} did not reach it within {self.timeout_s:.0f} s"
            )

    def abort(self) -> None:
        """Make every rank's waiting and later shared-buffer collectives raise at once (a peer
        died); gloo's raise by themselves."""
        if self._ctx is not None:
            self._lib.ck_shm_abort(self._ctx)

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over all ranks, in place; returns it."""
        if self._ctx is None or tensor.device.type != "cpu" or tensor.dtype not in _CODES:
            return super().all_reduce(tensor)
        work = tensor.contiguous()
        status = self._lib.ck_shm_all_reduce(self._ctx, work.data_ptr(), work.numel(), _CODES[tensor.dtype])
        self._check(status, "all_reduce")
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` (same shape on all ranks) along ``dim``, in rank order."""
        if self._ctx is None or tensor.device.type != "cpu":
            return super().all_gather(tensor, dim)
        part = tensor.contiguous()
        parts = part.new_empty((self.world_size, *part.shape))
        status = self._lib.ck_shm_all_gather(
            self._ctx, part.data_ptr(), part.numel() * part.element_size(), parts.data_ptr()
        )
        self._check(status, "all_gather")
        return torch.cat(parts.unbind(0), dim=dim)

    def _unmap(self) -> None:
        if self._ctx is not None:
            self._lib.ck_shm_close(self._ctx)
            self._ctx = None
        self._anchor = None  # the exported pointer must go before the map can close
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def close(self) -> None:
        """Unmap the shared buffer and leave the process group (idempotent)."""
        self._unmap()
        super().close()
