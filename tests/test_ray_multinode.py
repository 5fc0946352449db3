"""Ray across nodes: two Ray nodes started on this machine (Ray's ``cluster_utils.Cluster``: a
head and a second node, one CPU each, each with a resource of its own), the engine connecting
through ``RAY_ADDRESS``, ``-tp 2`` and ``-pp 2`` with one rank on each node.

The ranks must land on both nodes, give one rank's greedy tokens, and count as on two hosts:
the CPU plugin's communicator uses gloo between them, not shared memory (~60 s on 2 cores).
"""

import pytest

from core import LLM, SamplingParams

PROMPTS = [[5, 17, 200, 3], list(range(10, 47)), [9]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def two_nodes():
    """The address of a two-node Ray cluster on this machine."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"node_a": 1}, "include_dashboard": False}
    )
    try:
        cluster.add_node(num_cpus=1, resources={"node_b": 1})
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()


def greedy(model, **kwargs):
    return LLM(model=str(model), device="cpu_x86", dtype="float32", skip_tokenizer_init=True, max_model_len=128,
               kv_cache_bytes=1 << 22, **kwargs)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("split", [{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}], ids=["tp2", "pp2"])
def test_ranks_on_two_nodes_give_one_ranks_tokens(split, two_nodes, tiny_llama, monkeypatch):
    import ray

    one = greedy(tiny_llama)
    try:
        expected = [o.outputs[0].token_ids for o in one.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)]
    finally:
        one.shutdown()
    monkeypatch.setenv("RAY_ADDRESS", two_nodes)
    monkeypatch.setenv("CORE_RAY_PLACEMENT_STRATEGY", "STRICT_SPREAD")
    llm = greedy(tiny_llama, distributed_executor_backend="ray", **split)
    try:
        executor = llm.engine.executor
        nodes = ray.util.placement_group_table(executor.group)["bundles_to_node_id"]
        assert len(set(nodes.values())) == 2, nodes
        resources = {n["NodeID"]: n["Resources"] for n in ray.nodes()}
        assert {k for node in nodes.values() for k in resources[node] if k.startswith("node_")} == {"node_a", "node_b"}
        # each rank's communicator (its stage's, or the pipeline's): its class and whether it shares memory
        shared = [
            a.__ray_call__.remote(lambda actor: [(type(c).__name__, c.is_shared) for c in
                                                 (actor.worker.comm, actor.worker.pp_comm) if c is not None])
            for a in executor.actors
        ]  # fmt: skip
        assert ray.get(shared) == [[("SharedMemoryCommunicator", False)]] * 2  # two hosts: gloo
        outs = llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS)
        assert [o.outputs[0].token_ids for o in outs] == expected
    finally:
        llm.shutdown()
    assert not ray.is_initialized(), "the executor connected to the cluster: it disconnects at shutdown"
