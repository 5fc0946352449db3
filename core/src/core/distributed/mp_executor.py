"""``--distributed-executor-backend mp``: one worker process per rank (tensor x pipeline parallel) on this machine.

Also used for one rank when the engine is one data-parallel replica of several, so each
replica has its own process and CPUs. A heartbeat per process tells a hung worker from a
busy one; a worker whose driver is gone exits.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import threading
import time
import traceback
from multiprocessing.connection import Connection, wait
from typing import Any

from plugins import EngineConfigView, Platform
from plugins.distributed import free_tcp_address

from core.distributed.executor import HANG_TIMEOUT_S, STARTUP_TIMEOUT_S, RemoteExecutor, WorkerFailed, worker_configs
from core.distributed.worker import Worker

logger = logging.getLogger(__name__)


def _worker_main(
    platform_class: type, config: EngineConfigView, address: str, load_tokenizer: bool, conn: Connection, beat: Any
) -> None:
    """A worker process: build the :class:`Worker`, then answer calls until told to stop."""
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s (rank {config.rank}) %(levelname)s %(name)s: %(message)s"
    )
    parent = os.getppid()

    def heartbeat() -> None:  # proves liveness; a worker whose driver is gone exits (no orphans)
        while True:
            beat.value = time.monotonic()
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(0.2)

    threading.Thread(target=heartbeat, daemon=True).start()
    worker = None
    try:
        worker = Worker(platform_class(), config, config.model, address, load_tokenizer)
        conn.send_bytes(pickle.dumps(("ok", None)))
        while True:
            method, args = pickle.loads(conn.recv_bytes())
            if method == "close":
                break
            try:
                conn.send_bytes(pickle.dumps(("ok", getattr(worker, method)(*args)), protocol=5))
            except Exception:
                conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    except EOFError:
        pass  # the driver went away
    except Exception:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    finally:
        if worker is not None:
            worker.close()


class MultiprocExecutor(RemoteExecutor):
    """One worker process per rank of the split model on this machine (``mp``)."""

    def __init__(self, platform: Platform, config: EngineConfigView, load_tokenizer: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        address = free_tcp_address()
        self.config = config
        self.num_workers = config.world_size
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.beats: list[Any] = []
        for r, worker_config in enumerate(worker_configs(config)):
            ours, theirs = ctx.Pipe()
            beat = ctx.Value("d", 0.0, lock=False)  # 0 until the process has started its heartbeat
            proc = ctx.Process(
                target=_worker_main,
                args=(type(platform), worker_config, address, load_tokenizer and not r, theirs, beat),
                name=f"core-worker-rank{worker_config.rank}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.conns.append(ours)
            self.procs.append(proc)
            self.beats.append(beat)
        logger.info("started %d worker processes (pids %s)", self.num_workers, [p.pid for p in self.procs])
        try:
            self._gather(range(self.num_workers), STARTUP_TIMEOUT_S)  # every Worker is built
            self.setup()
        except BaseException:
            self.shutdown()
            raise

    def call_all(self, method: str, *args: Any, timeout: float | None) -> list[Any]:
        message = pickle.dumps((method, args), protocol=5)
        try:
            for rank, conn in enumerate(self.conns):
                try:
                    conn.send_bytes(message)
                except OSError as exc:
                    raise WorkerFailed(rank, f"cannot send to it ({exc})") from None
            return self._gather(range(self.num_workers), timeout)
        except WorkerFailed:
            self.shutdown()
            raise

    def check_health(self) -> None:
        try:
            self._check_alive()
        except WorkerFailed:
            self.shutdown()
            raise

    def _check_alive(self) -> None:
        now = time.monotonic()
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                raise WorkerFailed(rank, f"process {proc.pid} exited with code {proc.exitcode}")
            if 0 < self.beats[rank].value < now - HANG_TIMEOUT_S:
                raise WorkerFailed(rank, f"process {proc.pid} hung: no heartbeat for {HANG_TIMEOUT_S:.0f} s")

    def _blame_dead_peer(self, grace_s: float = 2.0) -> None:
        """Raise for a rank that died, when one did within ``grace_s``.

        A rank whose peer died fails inside a collective ("connection reset by peer") at
        about the moment the peer's process ends: the dead rank is the cause to report. Its
        sentinel is ready once its files are closed, a moment before the kernel lets it be
        reaped (and ``exitcode`` be known): it is joined for that moment.
        """
        ready = wait([p.sentinel for p in self.procs], timeout=grace_s)
        for rank, proc in enumerate(self.procs):
            if proc.sentinel in ready:
                proc.join(timeout=grace_s)
                raise WorkerFailed(rank, f"process {proc.pid} exited with code {proc.exitcode}")
        self._check_alive()

    def _gather(self, ranks: range, timeout: float | None) -> list[Any]:
        """Every rank's answer, watching all of them for death and silence while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[int, Any] = {}
        while len(results) < len(ranks):
            pending = {self.conns[r]: r for r in ranks if r not in results}
            ready = wait([*pending, *(p.sentinel for p in self.procs)], timeout=0.5)
            for conn in ready:
                if conn in pending:
                    rank = pending[conn]
                    try:
                        status, payload = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        raise WorkerFailed(rank, "its connection closed (process died)") from None
                    if status == "error":
                        self._blame_dead_peer()
                        raise WorkerFailed(rank, payload)
                    results[rank] = payload
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                late = sorted(set(ranks) - set(results))
                raise WorkerFailed(late[0], f"no answer within {timeout:.0f} s")
        return [results[r] for r in ranks]

    def shutdown(self) -> None:
        """Ask every worker to stop, then kill what is left; no process outlives this call."""
        for conn in self.conns:
            try:
                conn.send_bytes(pickle.dumps(("close", ())))
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for proc in self.procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0))
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []
