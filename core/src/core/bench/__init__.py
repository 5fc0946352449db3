"""``core bench``: offline throughput and online serving benchmarks (like ``vllm bench``).

- :mod:`core.bench.throughput`: ``core bench throughput``, :class:`core.LLM` offline on
  random token prompts.
- :mod:`core.bench.serve`: ``core bench serve``, streaming clients against a running
  server's ``/v1/completions`` at several concurrency levels.
- :mod:`core.bench.stats` / :mod:`core.bench.report`: percentiles, tables, JSON, plot.
"""
