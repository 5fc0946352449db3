"""Executors: where the engine's workers run.

- :class:`LocalExecutor`: one unsplit model in the engine's own process.
- :class:`MultiprocExecutor` (``--distributed-executor-backend mp``): one worker process
  per tensor-parallel rank on this machine (also for one rank when the engine is one
  data-parallel replica of several, so each replica has its own process and CPUs).
- :class:`core.distributed.ray_executor.RayExecutor` (``ray``): one Ray actor per rank in
  a placement group, on a local Ray instance or an existing cluster.

The engine (scheduler and sampler) stays in the driver. Every executor exposes
``loaded`` (the model's tokenizer and limits), ``kv_plan``, :meth:`execute`,
:meth:`check_health` (for an idle engine) and :meth:`shutdown`. A worker that dies, fails or stops answering raises
:class:`WorkerFailed` naming its rank, after every worker has been stopped.
"""

from __future__ import annotations

import dataclasses
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

from core.distributed.worker import Worker
from core.loader import ModelSource
from core.model_runner import StepLogits, make_batch
from core.scheduler import ScheduledSeq

logger = logging.getLogger(__name__)

#: seconds a worker may go without a heartbeat (mp) or an answer (ray) before it counts as hung
HANG_TIMEOUT_S = float(os.environ.get("CORE_WORKER_HANG_TIMEOUT", "20"))
#: seconds the workers may take to load the model and plan their KV caches
STARTUP_TIMEOUT_S = 900.0


class WorkerFailed(RuntimeError):
    """A tensor-parallel worker died, raised or hung; ``rank`` names it."""

    def __init__(self, rank: int, reason: str) -> None:
        super().__init__(f"tensor-parallel worker rank {rank} failed: {reason}")
        self.rank = rank


class LocalExecutor:
    """The model in the engine's own process (``tensor_parallel_size`` 1)."""

    def __init__(self, platform: Platform, config: EngineConfigView, model: ModelSource, load_tokenizer: bool) -> None:
        self.worker = Worker(platform, config, model, load_tokenizer=load_tokenizer)
        self.runner = self.worker.runner
        self.loaded = self.worker.loaded
        self.kv_plan = self.worker.plan_kv_cache()
        self.worker.allocate_kv_cache(self.kv_plan.num_blocks)

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        return self.runner.execute(scheduled)

    def check_health(self) -> None:
        """Nothing to watch: the model runs in this process."""

    def shutdown(self) -> None:
        self.worker.close()


class RemoteExecutor:
    """Workers in other processes: start them, agree on a KV cache size, run steps in lock-step.

    Subclasses start the workers and implement :meth:`call_all`.
    """

    num_workers: int

    def setup(self) -> None:
        """Load on every rank, size every rank's KV cache to the smallest rank's plan."""
        descriptions = self.call_all("describe", timeout=STARTUP_TIMEOUT_S)
        plans = self.call_all("plan_kv_cache", timeout=STARTUP_TIMEOUT_S)
        self.kv_plan = min(plans, key=lambda p: p.num_blocks)
        logger.info(
            "KV blocks per rank: %s; every rank uses %d", [p.num_blocks for p in plans], self.kv_plan.num_blocks
        )
        self.call_all("allocate_kv_cache", self.kv_plan.num_blocks, timeout=STARTUP_TIMEOUT_S)
        self.loaded = descriptions[0]

    def execute(self, scheduled: list[ScheduledSeq]) -> StepLogits:
        return self.call_all("execute", make_batch(scheduled), timeout=None)[0]

    def check_health(self) -> None:
        """Raise :class:`WorkerFailed` (all workers stopped) when a worker died or hung."""
        raise NotImplementedError

    def call_all(self, method: str, *args: Any, timeout: float | None) -> list[Any]:
        """Call ``Worker.<method>(*args)`` on every rank; the results in rank order.

        :param timeout: seconds to wait for all answers; None: as long as every worker
            is alive and not hung.
        :raises WorkerFailed: naming the first rank that died, raised or hung (all are stopped).
        """
        raise NotImplementedError

    def shutdown(self) -> None:
        raise NotImplementedError


def worker_configs(config: EngineConfigView) -> list[EngineConfigView]:
    """Each tensor-parallel rank's view of ``config`` (global ranks from ``config.rank``, the replica's first)."""
    return [
        dataclasses.replace(config, rank=config.rank + r, local_rank=config.local_rank + r)
        for r in range(config.tensor_parallel_size)
    ]


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
    """One worker process per tensor-parallel rank on this machine (``mp``)."""

    def __init__(self, platform: Platform, config: EngineConfigView, load_tokenizer: bool) -> None:
        ctx = multiprocessing.get_context("spawn")
        address = free_tcp_address()
        self.num_workers = config.tensor_parallel_size
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


def make_executor(platform: Platform, config: EngineConfigView, model: ModelSource, load_tokenizer: bool) -> Any:
    """The executor ``config`` asks for: in this process for one rank of one replica, else ``mp`` or ``ray``."""
    if config.tensor_parallel_size == 1 and config.data_parallel_size == 1:
        return LocalExecutor(platform, config, model, load_tokenizer)
    if config.distributed_executor_backend == "ray":
        from core.distributed.ray_executor import RayExecutor

        return RayExecutor(platform, config, load_tokenizer)
    return MultiprocExecutor(platform, config, load_tokenizer)
