"""``--distributed-executor-backend ray``: one Ray actor per rank (tensor x pipeline parallel).

The actors live in one placement group (a bundle per rank of one unit of the Ray resource
the platform names, :attr:`plugins.Platform.ray_device_key`: a CPU, a GPU, a TPU, ...), on
the Ray instance ``ray.init()`` finds: the cluster at ``RAY_ADDRESS`` when it is set, else
the one ``ray start --head`` last started on this machine (``ray start --address`` joins
the other machines to it), else a local one it starts. The bundles are placed by
``CORE_RAY_PLACEMENT_STRATEGY`` (Ray's strategies; ``PACK`` by default, which fills a node
before the next: ``STRICT_SPREAD`` puts every rank on a node of its own). Rank 0's node
address is the communicator's rendezvous point, so ranks may sit on different nodes; each
rank's Ray node id is its node name to the communicator (``CORE_NODE_ID``), so ranks on two
Ray nodes of one machine are told apart (no shared memory between them).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from plugins import EngineConfigView, Platform
from plugins.distributed import NODE_ID_ENV, free_tcp_address

from core.distributed.executor import HANG_TIMEOUT_S, STARTUP_TIMEOUT_S, RemoteExecutor, WorkerFailed, worker_configs
from core.distributed.worker import Worker

logger = logging.getLogger(__name__)

# the variables a worker's platform reads travel with the actors (CPU binding, KV space, ...)
_ENV_PREFIXES = ("CORE_", "VLLM_")
#: the variable that chooses how the ranks' bundles are placed over the cluster's nodes
PLACEMENT_ENV = "CORE_RAY_PLACEMENT_STRATEGY"
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def placement_strategy() -> str:
    """The placement group strategy :data:`PLACEMENT_ENV` names (``PACK`` when unset).

    :raises ValueError: naming the variable, for a strategy Ray does not have.
    """
    strategy = os.environ.get(PLACEMENT_ENV, "PACK")
    if strategy not in PLACEMENT_STRATEGIES:
        raise ValueError(f"{PLACEMENT_ENV}={strategy!r}: expected one of {', '.join(PLACEMENT_STRATEGIES)}")
    return strategy


def rank_resources(key: str) -> dict[str, Any]:
    """The ``ray.remote`` options that reserve one unit of Ray resource ``key`` for a rank's actor.

    Ray takes CPUs and GPUs as ``num_cpus``/``num_gpus`` and every other resource by name; an
    actor on a device reserves no CPU, so it fits its placement-group bundle of that device.
    """
    if key == "CPU":
        return {"num_cpus": 1}
    if key == "GPU":
        return {"num_cpus": 0, "num_gpus": 1}
    return {"num_cpus": 0, "resources": {key: 1}}


class RankActor:
    """The body of one rank's actor: a :class:`Worker` built once the rendezvous address is known."""

    def __init__(self, platform_class: type, config: EngineConfigView, load_tokenizer: bool) -> None:
        import ray

        logging.basicConfig(level=logging.INFO, format=f"(rank {config.rank}) %(levelname)s %(name)s: %(message)s")
        os.environ[NODE_ID_ENV] = ray.get_runtime_context().get_node_id()
        self.platform_class = platform_class
        self.config = config
        self.load_tokenizer = load_tokenizer
        self.worker: Worker | None = None

    def rendezvous_address(self) -> str:
        """A free ``tcp://`` address on this actor's node (asked of rank 0)."""
        import ray

        return free_tcp_address(ray.util.get_node_ip_address())

    def start(self, init_method: str) -> None:
        self.worker = Worker(self.platform_class(), self.config, self.config.model, init_method, self.load_tokenizer)

    def ping(self) -> None:
        """Answer (the driver's liveness check)."""

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


class RayExecutor(RemoteExecutor):
    """Tensor-parallel ranks as Ray actors in a placement group."""

    def __init__(self, platform: Platform, config: EngineConfigView, load_tokenizer: bool) -> None:
        try:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        except ImportError:
            raise ValueError(
                "distributed_executor_backend 'ray' needs Ray: pip install ray (or use --distributed-executor-backend mp)"
            ) from None
        self._ray = ray
        self._remove_placement_group = remove_placement_group
        self.config = config
        self.num_workers = config.world_size
        #: whether this executor started Ray (then it stops it too: Ray's own exit hook does not run
        #: when the server dies of its re-raised SIGTERM, and its agents would outlive it)
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(log_to_driver=True, include_dashboard=False)
        key, strategy = platform.ray_device_key, placement_strategy()
        self.group = placement_group([{key: 1}] * self.num_workers, strategy=strategy)
        self.actors: list[Any] = []
        try:
            ray.get(self.group.ready(), timeout=60)
        except ray.exceptions.GetTimeoutError:
            self.shutdown()
            per_node = [n["Resources"].get(key, 0) for n in ray.nodes() if n["Alive"]]
            raise ValueError(
                f"Ray could not place {self.num_workers} workers of one {key} each ({strategy}) within 60 s: "
                f"the cluster's nodes have {per_node} {key}"
            ) from None
        nodes = ray.util.placement_group_table(self.group)["bundles_to_node_id"]
        logger.info("ranks placed (%s) on Ray nodes %s", strategy, [nodes[r] for r in range(self.num_workers)])
        env = {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}
        actor_class = ray.remote(**rank_resources(key))(RankActor)
        for r, worker_config in enumerate(worker_configs(config)):
            strategy = PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=r)
            self.actors.append(
                actor_class.options(scheduling_strategy=strategy, runtime_env={"env_vars": env}).remote(
                    type(platform), worker_config, load_tokenizer and r == 0
                )
            )
        try:
            address = self._wait([self.actors[0].rendezvous_address.remote()], STARTUP_TIMEOUT_S)[0]
            self._wait([a.start.remote(address) for a in self.actors], STARTUP_TIMEOUT_S)
            self.setup()
        except BaseException:
            self.shutdown()
            raise

    def call_all(self, method: str, *args: Any, timeout: float | None) -> list[Any]:
        refs = [actor.call.remote(method, *args) for actor in self.actors]
        try:
            return self._wait(refs, timeout if timeout is not None else HANG_TIMEOUT_S)
        except WorkerFailed:
            self.shutdown()
            raise

    def check_health(self) -> None:
        try:
            self._wait([actor.ping.remote() for actor in self.actors], HANG_TIMEOUT_S)
        except WorkerFailed:
            self.shutdown()
            raise

    def _wait(self, refs: list[Any], timeout: float) -> list[Any]:
        """The results of one call per rank; a failed or silent actor raises :class:`WorkerFailed`."""
        ray = self._ray
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        dead, raised = [], []  # an actor that died or raised answers with its error
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                dead.append((refs.index(ref), exc))
            except ray.exceptions.RayTaskError as exc:
                raised.append((refs.index(ref), exc))
        if dead or raised:  # a dead actor first: its peers' failures inside a collective follow from it
            rank, exc = min(dead or raised, key=lambda f: f[0])
            raise WorkerFailed(rank, str(exc).splitlines()[0]) from None
        if pending:
            raise WorkerFailed(refs.index(pending[0]), f"no answer within {timeout:.0f} s (hung)")
        return ray.get(refs)

    def shutdown(self) -> None:
        """Kill every actor, release the placement group, stop Ray if this executor started it."""
        for actor in self.actors:
            self._ray.kill(actor)
        self.actors = []
        if self.group is not None:
            self._remove_placement_group(self.group)
            self.group = None
        if self.owns_ray:
            self._ray.shutdown()
            self.owns_ray = False
