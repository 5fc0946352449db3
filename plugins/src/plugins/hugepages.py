"""Weights and KV caches in transparent huge pages, so a decode step streams them with few TLB misses.

A batch-1 decode step reads every weight once from memory. In 4 KiB pages each page of that
stream is a TLB miss and a page-table walk (a 100 MB model: ~24,000 a step, far beyond the
TLB's reach). :class:`HugePageArena` copies the repacked quantized weights into anonymous
memory marked ``MADV_HUGEPAGE`` before it is first touched, so the kernel backs it with 2 MiB
pages where it has them (``/sys/kernel/mm/transparent_hugepage/enabled`` ``always`` or
``madvise``; ``never``: ordinary pages, same results). The weights of a model share 64 MiB
mappings, so a small weight does not take a 2 MiB page of its own. Zen 4, 2 threads, the
default model's linears of a step (bench/decode_linears.py, load 7): 1.4x with huge pages.
The CPU platforms' KV caches come from :func:`empty` (attention streams each sequence's
cached blocks every step: 46 KB a token of the default model, ~70 MB at 1500 tokens).
"""

from __future__ import annotations

import math
import mmap
import threading

import torch

HUGE_PAGE = 2 << 20
#: bytes of one shared mapping; a tensor larger than this gets a mapping of its own
CHUNK = 32 * HUGE_PAGE
#: byte alignment of each tensor in a mapping (a cache line)
ALIGN = 64


def huge_pages_supported() -> bool:
    """Whether this Python can ask for transparent huge pages (``mmap.MADV_HUGEPAGE``: Linux)."""
    return hasattr(mmap, "MADV_HUGEPAGE")


def _mapping(nbytes: int) -> torch.Tensor:
    """``nbytes`` of fresh anonymous memory marked for huge pages (whole huge pages mapped),
    starting on a huge-page boundary, as a uint8 tensor that keeps the mapping alive."""
    pages = -(-nbytes // HUGE_PAGE)
    mm = mmap.mmap(-1, (pages + 1) * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mm.madvise(mmap.MADV_HUGEPAGE)  # before the first touch: page faults then take huge pages
    buf = torch.frombuffer(mm, dtype=torch.uint8)
    start = -buf.data_ptr() % HUGE_PAGE
    return buf[start : start + nbytes]


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor in fresh memory marked for huge pages (zero pages until written,
    resident only where touched, as a large ``torch.empty``); ordinary memory where huge pages
    cannot be asked for (:func:`huge_pages_supported`)."""
    if not huge_pages_supported():
        return torch.empty(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return _mapping(nbytes).view(dtype).view(shape)


class HugePageArena:
    """Copies tensors into memory marked for transparent huge pages (see the module docstring).

    Each copy is cache-line aligned and keeps its mapping alive; a mapping is unmapped when no
    copy in it is left. Where huge pages cannot be asked for (:func:`huge_pages_supported`),
    :meth:`copy` returns its argument.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chunk: torch.Tensor | None = None
        self._used = 0

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``t`` (same dtype, shape and values) in huge-page memory."""
        if not huge_pages_supported() or t.numel() == 0:
            return t
        nbytes = t.numel() * t.element_size()
        out = self._take(nbytes).view(t.dtype).view(t.shape)
        out.copy_(t)
        return out

    def _take(self, nbytes: int) -> torch.Tensor:
        size = -(-nbytes // ALIGN) * ALIGN
        if size > CHUNK:
            return _mapping(nbytes)
        with self._lock:
            if self._chunk is None or self._used + size > CHUNK:
                self._chunk, self._used = _mapping(CHUNK), 0
            out = self._chunk[self._used : self._used + nbytes]
            self._used += size
        return out
