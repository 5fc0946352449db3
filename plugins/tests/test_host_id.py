"""What tells ranks' hosts apart: the host name and boot id, and the node id an executor sets."""

from plugins.distributed import NODE_ID_ENV, host_id


def test_a_node_id_tells_two_nodes_of_one_machine_apart(monkeypatch):
    monkeypatch.delenv(NODE_ID_ENV, raising=False)
    plain = host_id()
    monkeypatch.setenv(NODE_ID_ENV, "ray-node-b")
    on_node_b = host_id()
    assert plain[:2] == on_node_b[:2] and plain != on_node_b
    assert on_node_b[2] == "ray-node-b"
