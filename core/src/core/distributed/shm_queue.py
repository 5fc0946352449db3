"""A one-writer, many-reader message queue in shared memory: how the driver hands each step to the other ranks.

vLLM's ``MessageQueue`` idea: the writer copies a message once into a slot of a buffer that
every process maps (a file in ``/dev/shm``) and publishes it by bumping a counter; each reader
copies it out and bumps its own read counter, which frees the slot. A reader waiting for the
next message spins (yielding its core) for :data:`SPIN_S`, then sleeps on a pipe (its
"doorbell") after raising its ``sleeping`` flag; the writer rings only the doorbells of readers
whose flag is up, so a step that follows the last one closely costs no system call on either
side. Messages are bytes: the step's inputs are plain lists (:class:`core.model_runner.StepBatch`),
pickled once for all readers.

Layout: a line for the write counter, a line per reader (its read counter and ``sleeping``
flag), then :attr:`ShmQueue.num_slots` slots of ``slot_bytes`` (a length, then the message).
Counters are aligned 8-byte words; :func:`memory_fence` orders a store before a later load
(the flag and the counters form a Dekker pair) on any CPU.
"""

from __future__ import annotations

import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

#: seconds a reader spins for the next message before it sleeps on its doorbell
SPIN_S = 0.002
#: where the buffer's file is made (a tmpfs on Linux)
SHM_DIR = "/dev/shm"
_LINE = 64
_PAGE = 4096
_fence_lock = threading.Lock()


def memory_fence() -> None:
    """A full memory barrier (a lock's acquire and release are one on every CPU CPython runs on)."""
    _fence_lock.acquire()
    _fence_lock.release()


@dataclass(frozen=True)
class QueueHandle:
    """What a reader process needs to open the queue (picklable; the file is unlinked once all opened)."""

    path: str
    num_readers: int
    num_slots: int
    slot_bytes: int


class ShmQueue:
    """One end of the queue: the writer's (:meth:`create`) or reader ``reader``'s (:meth:`open`)."""

    def __init__(self, handle: QueueHandle, reader: int | None, doorbells: list[Connection]) -> None:
        self.handle, self.reader, self.doorbells = handle, reader, doorbells
        with open(handle.path, "r+b") as f:
            self._mmap = mmap.mmap(f.fileno(), _size(handle))
        self._words = memoryview(self._mmap).cast("Q")  # the counters and flags
        self._data_start = _data_offset(handle.num_readers)
        self._next = self._words[self._read_index(reader)] if reader is not None else self._words[0]

    @classmethod
    def create(
        cls, num_readers: int, doorbells: list[Connection], num_slots: int = 2, slot_bytes: int = 4 << 20
    ) -> ShmQueue:
        """The writer's end of a new queue; ``doorbells``: the sending end of a one-way pipe per reader."""
        if num_readers < 1 or len(doorbells) != num_readers:
            raise ValueError(f"need one doorbell per reader: {len(doorbells)} for {num_readers} readers")
        if num_slots < 1 or slot_bytes <= 8 or slot_bytes % _LINE:
            raise ValueError(f"num_slots must be >= 1 and slot_bytes a multiple of {_LINE} above 8")
        fd, path = tempfile.mkstemp(prefix="core-steps-", dir=SHM_DIR)
        handle = QueueHandle(path, num_readers, num_slots, slot_bytes)
        try:
            os.ftruncate(fd, _size(handle))
        finally:
            os.close(fd)
        return cls(handle, None, doorbells)

    @classmethod
    def open(cls, handle: QueueHandle, reader: int, doorbell: Connection) -> ShmQueue:
        """Reader ``reader``'s end (``0 <= reader < num_readers``); ``doorbell``: its pipe's receiving end."""
        if not 0 <= reader < handle.num_readers:
            raise ValueError(f"reader {reader} is outside [0, {handle.num_readers})")
        return cls(handle, reader, [doorbell])

    def unlink(self) -> None:
        """Remove the buffer's file (once every reader has opened it; the maps stay valid)."""
        try:
            os.unlink(self.handle.path)
        except FileNotFoundError:
            pass

    def put(self, message: bytes, check: Callable[[], None] = lambda: None, timeout_s: float | None = None) -> None:
        """Publish ``message`` to every reader (writer only), waiting while every slot still
        holds a message some reader has not taken.

        :param check: called every few milliseconds while waiting; it raises to give up
            (a reader that died).
        :raises ValueError: a message longer than a slot holds.
        :raises TimeoutError: still no free slot after ``timeout_s``.
        """
        h, n = self.handle, self._next
        if len(message) > h.slot_bytes - 8:
            raise ValueError(f"a message of {len(message)} bytes exceeds the queue's {h.slot_bytes - 8}-byte slots")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last_check = time.monotonic()
        while any(n - self._words[self._read_index(r)] >= h.num_slots for r in range(h.num_readers)):
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise TimeoutError(f"no reader freed a slot of the step queue within {timeout_s} s")
            if now - last_check > 0.005:
                check()
                last_check = now
            os.sched_yield()
        start = self._data_start + (n % h.num_slots) * h.slot_bytes
        self._mmap[start + 8 : start + 8 + len(message)] = message
        self._words[start // 8] = len(message)
        memory_fence()  # the message before the counter
        self._words[0] = self._next = n + 1
        memory_fence()  # the counter before reading the flags (pairs with the reader's)
        for r, bell in enumerate(self.doorbells):
            if self._words[self._read_index(r) + 1]:
                try:
                    bell.send_bytes(b"")
                except OSError:
                    pass  # a reader that is gone; its owner learns of it otherwise (``check``, its process)

    def get(self) -> bytes:
        """The next message (reader only): spins, then sleeps until the writer publishes it."""
        n, words, bell = self._next, self._words, self.doorbells[0]
        flag = self._read_index(self.reader) + 1
        spin_until = time.monotonic() + SPIN_S
        while words[0] <= n:
            if time.monotonic() < spin_until:
                os.sched_yield()
                continue
            words[flag] = 1
            memory_fence()  # the flag before the counter (pairs with the writer's)
            if words[0] <= n:
                bell.poll(None)
            while bell.poll(0):  # doorbells rung for this message or an earlier one
                bell.recv_bytes()
            words[flag] = 0
        memory_fence()  # the counter before the message
        start = self._data_start + (n % self.handle.num_slots) * self.handle.slot_bytes
        message = self._mmap[start + 8 : start + 8 + words[start // 8]]
        memory_fence()  # the copy before freeing the slot
        words[self._read_index(self.reader)] = self._next = n + 1
        return message

    def close(self) -> None:
        """Unmap the buffer (idempotent)."""
        if self._mmap.closed:
            return
        self._words.release()
        self._mmap.close()

    @staticmethod
    def _read_index(reader: int) -> int:
        return (1 + reader) * _LINE // 8


def _data_offset(num_readers: int) -> int:
    return ((1 + num_readers) * _LINE + _PAGE - 1) // _PAGE * _PAGE


def _size(handle: QueueHandle) -> int:
    return _data_offset(handle.num_readers) + handle.num_slots * handle.slot_bytes
