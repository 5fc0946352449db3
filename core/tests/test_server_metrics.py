"""/metrics: every replica's stats snapshot (label ``engine``), the platform's own gauges included."""

from core.server.metrics import ServerMetrics


def _stats(running: int, graphs: int) -> dict:
    return {
        "num_running": running,
        "num_waiting": 0,
        "kv_usage": 0.5,
        "num_total_blocks": 10,
        "block_size": 16,
        "kv_cache_dtype": "fp8_e4m3",
        "prefix_cache_queries": 0,
        "prefix_cache_hits": 0,
        "num_preemptions": 0,
        "platform": {"graphs_compiled": graphs},
    }


def test_platform_gauges_are_exported_under_their_own_names_per_replica():
    text = ServerMetrics(lambda: [_stats(1, 7), _stats(2, 5)], "m").render().decode()
    assert 'core:platform_graphs_compiled{engine="0",model_name="m"} 7.0' in text
    assert 'core:platform_graphs_compiled{engine="1",model_name="m"} 5.0' in text
    assert 'core:num_requests_running{engine="0",model_name="m"} 1.0' in text
    assert 'core:num_requests_running{engine="1",model_name="m"} 2.0' in text
    assert text.count("# TYPE core:platform_graphs_compiled gauge") == 1


def test_kv_capacity_and_cache_dtype_are_exported():
    text = ServerMetrics(lambda: [_stats(1, 7)], "m").render().decode()
    assert 'core:kv_cache_capacity_tokens{engine="0",model_name="m"} 160.0' in text
    assert (
        'core:cache_config_info{block_size="16",cache_dtype="fp8_e4m3",engine="0",model_name="m",num_blocks="10"} 1.0'
        in text
    )


def test_spec_decode_counters_only_for_an_engine_that_speculates():
    spec = {"num_drafts": 3, "num_draft_tokens": 12, "num_accepted_tokens": 7, "num_accepted_tokens_per_pos": [3, 2]}
    text = ServerMetrics(lambda: [{**_stats(1, 7), "spec_decode": spec}], "m").render().decode()
    assert 'core:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0' in text
    assert 'core:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0' in text
    assert 'core:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0' in text
    assert 'core:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0' in text
    plain = ServerMetrics(lambda: [{**_stats(1, 7), "spec_decode": None}], "m").render().decode()
    assert "spec_decode" not in plain
