"""The driver's step queue (core.distributed.shm_queue): every reader gets every message, in order, intact."""

import multiprocessing
import os
import time

import pytest
from core.distributed.shm_queue import ShmQueue


def _read(handle, reader, bell, count, out) -> None:
    queue = ShmQueue.open(handle, reader, bell)
    got = []
    for _ in range(count):
        got.append(queue.get())
        if len(got) % 50 == 0:
            time.sleep(0.01)  # outlast the spin: the next messages arrive while this reader sleeps
    queue.close()
    out.put((reader, [len(m) for m in got], all(m == _message(i) for i, m in enumerate(got))))


def _message(i: int) -> bytes:
    return i.to_bytes(8, "little") * (1 + (i * 7919) % 3000)


@pytest.mark.parametrize("num_readers", [1, 2])
def test_every_reader_gets_every_message_in_order(num_readers):
    ctx = multiprocessing.get_context("spawn")
    bells = [ctx.Pipe(duplex=False) for _ in range(num_readers)]
    queue = ShmQueue.create(num_readers, [send for _, send in bells], num_slots=2, slot_bytes=1 << 15)
    out, count = ctx.Queue(), 400
    procs = [ctx.Process(target=_read, args=(queue.handle, r, bells[r][0], count, out)) for r in range(num_readers)]
    for p in procs:
        p.start()
    try:
        for i in range(count):  # two slots: the writer waits for the slowest reader
            queue.put(_message(i))
        results = sorted(out.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
        queue.unlink()
        queue.close()
    for reader, lengths, intact in results:
        assert lengths == [len(_message(i)) for i in range(count)], reader
        assert intact, reader
    assert not os.path.exists(queue.handle.path)


def test_a_message_larger_than_a_slot_is_refused_and_a_full_queue_times_out():
    _, send = multiprocessing.Pipe(duplex=False)
    queue = ShmQueue.create(1, [send], num_slots=1, slot_bytes=1024)
    try:
        with pytest.raises(ValueError, match="2000 bytes exceeds the queue's 1016-byte slots"):
            queue.put(b"x" * 2000)
        queue.put(b"first")  # no reader takes it: the only slot stays full
        with pytest.raises(TimeoutError, match="no reader freed a slot"):
            queue.put(b"second", timeout_s=0.05)
        calls = []

        def dead_reader():
            calls.append(1)
            raise RuntimeError("reader 0 died")

        with pytest.raises(RuntimeError, match="reader 0 died"):
            queue.put(b"second", check=dead_reader)
        assert calls == [1]
    finally:
        queue.unlink()
        queue.close()
