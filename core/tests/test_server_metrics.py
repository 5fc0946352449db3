"""/metrics: the engine's stats snapshot, the platform's own gauges included."""

from core.server.metrics import ServerMetrics


def test_platform_gauges_are_exported_under_their_own_names():
    stats = {
        "num_running": 1,
        "num_waiting": 0,
        "kv_usage": 0.5,
        "prefix_cache_queries": 0,
        "prefix_cache_hits": 0,
        "num_preemptions": 0,
        "platform": {"graphs_compiled": 7},
    }
    text = ServerMetrics(lambda: stats, "m").render().decode()
    assert 'core:platform_graphs_compiled{model_name="m"} 7.0' in text
    assert 'core:num_requests_running{model_name="m"} 1.0' in text
