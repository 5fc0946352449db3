"""Prometheus metrics, named like vLLM's (``core:`` for ``vllm:``).

Gauges and the prefix-cache counters are read from each engine replica's stats snapshot
at scrape time (label ``engine``: the data-parallel replica, as vLLM labels them); token counters and latency histograms are fed per request by :class:`RequestTracker`
from the engine's own timestamps (so they measure the engine, not the event loop). Each
server owns its registry: no process-wide state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from core.outputs import RequestOutput

_LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0)


class _EngineStatsCollector:
    """Reads every replica's stats snapshot on every scrape."""

    def __init__(self, stats: Callable[[], list[dict[str, Any]]], model_name: str) -> None:
        self.stats = stats
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        names = ["model_name", "engine"]
        families: dict[str, Metric] = {}
        for index, s in enumerate(self.stats()):
            for name, doc, kind, value in self._samples(s):
                if name not in families:
                    families[name] = kind(name, doc, labels=names)
                families[name].add_metric([self.model_name, str(index)], float(value))
            info = families.setdefault(
                "core:cache_config_info",
                GaugeMetricFamily(
                    "core:cache_config_info",
                    "Information of the KV cache config (value 1), as vLLM's.",
                    labels=[*names, "block_size", "cache_dtype", "num_blocks"],
                ),
            )
            info.add_metric(
                [self.model_name, str(index), str(s["block_size"]), s["kv_cache_dtype"], str(s["num_total_blocks"])],
                1.0,
            )
            if s.get("spec_decode") is not None:
                per_pos = families.setdefault(
                    "core:spec_decode_num_accepted_tokens_per_pos",
                    CounterMetricFamily(
                        "core:spec_decode_num_accepted_tokens_per_pos",
                        "Draft tokens accepted at each position of a run (0 first).",
                        labels=[*names, "position"],
                    ),
                )
                for pos, value in enumerate(s["spec_decode"]["num_accepted_tokens_per_pos"]):
                    per_pos.add_metric([self.model_name, str(index), str(pos)], float(value))
        yield from families.values()

    @staticmethod
    def _samples(s: dict[str, Any]) -> Iterator[tuple[str, str, type, float]]:
        for name, doc, value in (
            ("core:num_requests_running", "Requests in the running batch.", s["num_running"]),
            (
                "core:num_requests_waiting",
                "Requests waiting to be scheduled (pending admission included).",
                s["num_waiting"],
            ),
            ("core:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", s["kv_usage"]),
            (
                "core:kv_cache_capacity_tokens",
                "Tokens the KV cache holds (blocks x block size; a one-byte cache dtype holds twice fp16's).",
                s["num_total_blocks"] * s["block_size"],
            ),
            ("core:prefix_cache_hit_rate", "Prefix cache hits / queries, in blocks, since start.", _ratio(s)),
        ):
            yield name, doc, GaugeMetricFamily, value
        for name, doc, value in (
            ("core:prefix_cache_queries", "Blocks looked up in the prefix cache.", s["prefix_cache_queries"]),
            ("core:prefix_cache_hits", "Blocks found in the prefix cache.", s["prefix_cache_hits"]),
            ("core:num_preemptions", "Sequences preempted for lack of KV cache.", s["num_preemptions"]),
        ):
            yield name, doc, CounterMetricFamily, value
        spec = s.get("spec_decode")
        if spec is not None:  # an engine that speculates: vLLM's counters
            for name, doc, value in (
                ("core:spec_decode_num_drafts", "Speculative runs verified.", spec["num_drafts"]),
                ("core:spec_decode_num_draft_tokens", "Draft tokens proposed and verified.", spec["num_draft_tokens"]),
                ("core:spec_decode_num_accepted_tokens", "Draft tokens accepted.", spec["num_accepted_tokens"]),
            ):
                yield name, doc, CounterMetricFamily, value
        for name, value in s.get("platform", {}).items():
            yield f"core:platform_{name}", "Reported by the device platform.", GaugeMetricFamily, value


def _ratio(stats: dict[str, Any]) -> float:
    queries = stats["prefix_cache_queries"]
    return stats["prefix_cache_hits"] / queries if queries else 0.0


class ServerMetrics:
    """The metrics of one server; ``render()`` is the ``/metrics`` body."""

    def __init__(self, stats: Callable[[], list[dict[str, Any]]], model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineStatsCollector(stats, model_name))
        label = ["model_name"]

        def counter(name: str, doc: str, labels: list[str] = label) -> Counter:
            return Counter(name, doc, labels, registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, label, buckets=buckets, registry=self.registry).labels(model_name)

        self.prompt_tokens = counter("core:prompt_tokens", "Prompt tokens processed.").labels(model_name)
        self.generation_tokens = counter("core:generation_tokens", "Tokens generated.").labels(model_name)
        self._success = counter(
            "core:request_success", "Requests finished, by finish reason.", ["model_name", "finished_reason"]
        )
        self.model_name = model_name
        self.ttft = histogram("core:time_to_first_token_seconds", "Arrival to first token.", _LATENCY_BUCKETS)
        self.itl = histogram(
            "core:inter_token_latency_seconds", "Time between two tokens of a request.", _LATENCY_BUCKETS
        )
        self.e2e = histogram("core:e2e_request_latency_seconds", "Arrival to the last token.", _E2E_BUCKETS)
        self.queue_time = histogram("core:request_queue_time_seconds", "Arrival to first scheduled.", _E2E_BUCKETS)

    def request_success(self, finished_reason: str) -> None:
        """Count a finished request under its finish reason."""
        self._success.labels(self.model_name, finished_reason).inc()

    def track(self) -> RequestTracker:
        """A tracker for one engine request: feed it every output the request yields."""
        return RequestTracker(self)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestTracker:
    """Turns the cumulative outputs of one request into counter and histogram updates."""

    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics
        self.num_tokens = 0
        self.last_token_time: float | None = None
        self.has_prompt = False

    def observe(self, out: RequestOutput) -> None:
        m = self.metrics
        if not self.has_prompt:
            self.has_prompt = True
            m.prompt_tokens.inc(len(out.prompt_token_ids))
        num_tokens = sum(len(c.token_ids) for c in out.outputs)
        if num_tokens > self.num_tokens:
            m.generation_tokens.inc(num_tokens - self.num_tokens)
            self.num_tokens = num_tokens
        metrics = out.metrics
        if metrics is not None and metrics.last_token_time is not None:
            if self.last_token_time is None and metrics.first_token_time is not None:
                m.ttft.observe(max(0.0, metrics.first_token_time - metrics.arrival_time))
                if metrics.time_in_queue is not None:
                    m.queue_time.observe(metrics.time_in_queue)
            elif self.last_token_time is not None and metrics.last_token_time > self.last_token_time:
                m.itl.observe(metrics.last_token_time - self.last_token_time)
            self.last_token_time = metrics.last_token_time
        if out.finished:
            reasons = {c.finish_reason or "abort" for c in out.outputs}
            m.request_success(reasons.pop() if len(reasons) == 1 else "mixed")
            if metrics is not None:
                end = metrics.finished_time or metrics.last_token_time
                if end is not None:
                    m.e2e.observe(max(0.0, end - metrics.arrival_time))
