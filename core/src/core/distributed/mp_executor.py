"""``--distributed-executor-backend mp``: the ranks of a split model as processes on this machine.

Tensor parallel alone (vLLM's "driver worker"): rank 0 runs in the engine's own process, so
``-tp 2`` adds one process, not two; each call goes to the other ranks through a shared-memory
queue (:class:`core.distributed.shm_queue.ShmQueue`: written once, no pipe per rank, a step's
inputs pickled once), the driver runs its own part in place, and only it returns the step's
logits: the other ranks answer setup calls on their pipes but send nothing for a step unless
it failed. A thread watches them: a rank that dies or stops its heartbeat aborts the driver's
communicator (:meth:`plugins.distributed.Communicator.abort`), so the step waiting on it in a
collective fails at once, naming it.

Pipeline parallel (every stage in a worker process, micro-batches overlapping), and one rank
when the engine is one data-parallel replica of several (so each replica has its own process
and CPUs), call every rank over its pipe and wait for all answers.

A heartbeat per process tells a hung worker from a busy one; a worker whose driver is gone exits.
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
from core.distributed.shm_queue import QueueHandle, ShmQueue
from core.distributed.worker import Worker
from core.loader import ModelSource
from core.model_runner import StepLogits, make_batch
from core.scheduler import ScheduledSeq

logger = logging.getLogger(__name__)


def _worker_main(
    platform_class: type,
    config: EngineConfigView,
    address: str,
    load_tokenizer: bool,
    conn: Connection,
    beat: Any,
    steps: tuple[QueueHandle, int, Connection] | None,
) -> None:
    """A worker process: build the :class:`Worker`, then answer calls until told to stop.

    :param steps: the driver's queue (its handle, this rank's reader number, its doorbell) when
        calls come through it (see the module docstring), else None: calls come on ``conn``.
    """
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
    worker = queue = None
    try:
        if steps is not None:
            queue = ShmQueue.open(*steps)
        worker = Worker(platform_class(), config, config.model, address, load_tokenizer)
        conn.send_bytes(pickle.dumps(("ok", None)))
        while True:
            method, args = pickle.loads(conn.recv_bytes() if queue is None else queue.get())
            if method == "close":
                break
            try:
                result = getattr(worker, method)(*args)
            except Exception:
                conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
                if queue is not None and method == "execute":
                    os._exit(1)  # the driver's step waits on this rank in a collective: its exit ends it
                continue
            if queue is None or method != "execute":
                conn.send_bytes(pickle.dumps(("ok", result), protocol=5))
    except EOFError:
        pass  # the driver went away
    except Exception:
        conn.send_bytes(pickle.dumps(("error", traceback.format_exc())))
    finally:
        if worker is not None:
            worker.close()
        if queue is not None:
            queue.close()


class MultiprocExecutor(RemoteExecutor):
    """The ranks of the split model on this machine (``mp``): rank 0 in this process under
    tensor parallelism alone (:attr:`driver`), every other rank in a worker process of its own.

    :param model: the opened model, for the driver (loaded in this process).
    """

    def __init__(self, platform: Platform, config: EngineConfigView, model: ModelSource, load_tokenizer: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        address = free_tcp_address()
        configs = worker_configs(config)
        self.config = config
        self.num_workers = config.world_size
        use_driver = config.pipeline_parallel_size == 1 and config.data_parallel_size == 1 and config.world_size > 1
        #: rank 0's worker when it runs in this process, else None
        self.driver: Worker | None = None
        #: the rank of ``procs[0]``, ``conns[0]`` and ``beats[0]``
        self.first_remote = 1 if use_driver else 0
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.beats: list[Any] = []
        self.queue: ShmQueue | None = None
        bells = [ctx.Pipe(duplex=False) for _ in configs[self.first_remote :]] if use_driver else []
        if use_driver:
            self.queue = ShmQueue.create(len(bells), [send for _, send in bells])
        self._failure: WorkerFailed | None = None  # what the watcher found
        self._stop_watch = threading.Event()
        self._watcher: threading.Thread | None = None
        try:
            for i, worker_config in enumerate(configs[self.first_remote :]):
                rank = self.first_remote + i
                ours, theirs = ctx.Pipe()
                beat = ctx.Value("d", 0.0, lock=False)  # 0 until the process has started its heartbeat
                steps = (self.queue.handle, i, bells[i][0]) if self.queue is not None else None
                proc = ctx.Process(
                    target=_worker_main,
                    args=(type(platform), worker_config, address, load_tokenizer and not rank, theirs, beat, steps),
                    name=f"core-worker-rank{worker_config.rank}",
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
                self.beats.append(beat)
            logger.info(
                "started %d worker processes (pids %s)%s", len(self.procs), [p.pid for p in self.procs],
                "; rank 0 runs in this process" if use_driver else "",
            )  # fmt: skip
            if use_driver:
                self.driver = Worker(platform, configs[0], model, address, load_tokenizer)
            self._gather(STARTUP_TIMEOUT_S)  # every Worker is built
            if self.queue is not None:
                self.queue.unlink()
                self._watcher = threading.Thread(target=self._watch, name="core-worker-watch", daemon=True)
                self._watcher.start()
            self.setup()
        except BaseException:
            self.shutdown()
            raise

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        if self.driver is None:
            return super().execute(scheduled)
        batch = make_batch(scheduled)
        self._post("execute", batch)
        try:
            return self.driver.execute(batch)
        except Exception:
            self._fail_step(traceback.format_exc())

    def call_all(self, method: str, *args: Any, timeout: float | None) -> list[Any]:
        try:
            if self.driver is None:
                message = pickle.dumps((method, args), protocol=5)
                for i, conn in enumerate(self.conns):
                    try:
                        conn.send_bytes(message)
                    except OSError as exc:
                        raise WorkerFailed(self.first_remote + i, f"cannot send to it ({exc})") from None
                return self._gather(timeout)
            self._post(method, *args)
            try:
                mine = getattr(self.driver, method)(*args)
            except Exception:
                self._fail_step(traceback.format_exc())
            return [mine, *self._gather(timeout)]
        except WorkerFailed:
            self.shutdown()
            raise

    def _post(self, method: str, *args: Any) -> None:
        """Send a call to the other ranks through the queue (driver only)."""
        try:
            self.queue.put(pickle.dumps((method, args), protocol=5), check=self._check_alive)
        except WorkerFailed:
            self.shutdown()
            raise

    def _fail_step(self, driver_error: str) -> None:
        """The driver's part of a call raised: blame the rank that died, raised or hung (its
        failure aborted the driver's collective), else rank 0; stop everything and raise."""
        failure = None
        try:
            self._blame_dead_peer()
        except WorkerFailed as exc:
            failure = exc
        failure = failure or self._failure or WorkerFailed(0, driver_error)
        self.shutdown()
        raise failure

    def _watch(self) -> None:
        """(thread, driver only) Abort the driver's communicators when a rank dies or hangs
        (one whose step raised exits: :func:`_worker_main`)."""
        driver, sentinels = self.driver, [p.sentinel for p in self.procs]
        while not self._stop_watch.is_set():
            wait(sentinels, timeout=0.5)
            if self._stop_watch.is_set():
                return
            try:
                self._check_alive()
            except WorkerFailed as exc:
                self._failure = exc
                for comm in (driver.comm, driver.pp_comm):
                    if comm is not None:
                        comm.abort()
                return

    def check_health(self) -> None:
        try:
            if self._failure is not None:
                raise self._failure
            self._check_alive()
        except WorkerFailed:
            self.shutdown()
            raise

    def _check_alive(self) -> None:
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            rank = self.first_remote + i
            if proc.exitcode is not None:
                raise WorkerFailed(rank, f"process {proc.pid} exited with code {proc.exitcode}")
            if 0 < self.beats[i].value < now - HANG_TIMEOUT_S:
                raise WorkerFailed(rank, f"process {proc.pid} hung: no heartbeat for {HANG_TIMEOUT_S:.0f} s")

    def _blame_dead_peer(self, grace_s: float = 2.0) -> None:
        """Raise for a rank that died, when one did within ``grace_s``.

        A rank whose peer died fails inside a collective ("connection reset by peer") at
        about the moment the peer's process ends: the dead rank is the cause to report. Its
        sentinel is ready once its files are closed, a moment before the kernel lets it be
        reaped (and ``exitcode`` be known): it is joined for that moment. A rank that sent
        its failure (a step that raised there) is named with it.
        """
        ready = wait([p.sentinel for p in self.procs], timeout=grace_s)
        for i, proc in enumerate(self.procs):
            if proc.sentinel in ready:
                rank = self.first_remote + i
                if self.conns[i].poll(0):
                    try:
                        status, payload = pickle.loads(self.conns[i].recv_bytes())
                    except (EOFError, OSError):
                        status = None
                    if status == "error":
                        raise WorkerFailed(rank, payload)
                proc.join(timeout=grace_s)
                raise WorkerFailed(rank, f"process {proc.pid} exited with code {proc.exitcode}")
        self._check_alive()

    def _gather(self, timeout: float | None) -> list[Any]:
        """Every worker process's answer, in rank order, watching all of them for death and silence while waiting."""
        deadline = None if timeout is None else time.monotonic() + timeout
        results: dict[int, Any] = {}
        while len(results) < len(self.conns):
            pending = {conn: i for i, conn in enumerate(self.conns) if i not in results}
            ready = wait([*pending, *(p.sentinel for p in self.procs)], timeout=0.5)
            for conn in ready:
                if conn in pending:
                    i = pending[conn]
                    try:
                        status, payload = pickle.loads(conn.recv_bytes())
                    except (EOFError, OSError):
                        raise WorkerFailed(self.first_remote + i, "its connection closed (process died)") from None
                    if status == "error":
                        self._blame_dead_peer()
                        raise WorkerFailed(self.first_remote + i, payload)
                    results[i] = payload
            self._check_alive()
            if deadline is not None and time.monotonic() > deadline:
                late = sorted(set(range(len(self.conns))) - set(results))
                raise WorkerFailed(self.first_remote + late[0], f"no answer within {timeout:.0f} s")
        return [results[i] for i in range(len(self.conns))]

    def shutdown(self) -> None:
        """Ask every worker to stop, then kill what is left; no process outlives this call."""
        self._stop_watch.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join(timeout=5)
        message = pickle.dumps(("close", ()))
        if self.queue is not None:
            try:
                self.queue.put(message, timeout_s=1)
            except TimeoutError:
                pass  # a rank took no more calls: it is killed below
        else:
            for conn in self.conns:
                try:
                    conn.send_bytes(message)
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
        if self.driver is not None:
            self.driver.close()
            self.driver = None
        if self.queue is not None:
            self.queue.unlink()
            for bell in self.queue.doorbells:
                bell.close()
            self.queue.close()
            self.queue = None
