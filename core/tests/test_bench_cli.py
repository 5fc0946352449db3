"""``core bench``: argument parsing, percentile and summary arithmetic, report output, one tiny run."""

from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest
from core.bench.cli import concurrency_list
from core.bench.report import format_table, write_json
from core.bench.stats import RequestRecord, percentile, random_prompts, summarize_level
from core.cli import build_parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Through the ``core`` command's own parser: ``core bench`` must be reachable from the CLI."""
    return build_parser().parse_args(argv)


def test_throughput_flags_and_engine_flags():
    args = parse(["bench", "throughput", "m.gguf", "--num-prompts", "4", "--input-len", "8", "--output-len", "3",
                  "-q", "int8", "--max-num-seqs", "4", "--json", "out.json"])  # fmt: skip
    assert (args.num_prompts, args.input_len, args.output_len) == (4, 8, 3)
    assert (args.model, args.quantization, args.max_num_seqs, args.json) == ("m.gguf", "int8", 4, "out.json")
    defaults = parse(["bench", "throughput"])
    assert (defaults.num_prompts, defaults.input_len, defaults.output_len, defaults.model) == (32, 128, 128, None)


def test_serve_flags():
    args = parse(["bench", "serve", "--concurrency", "1,4", "--num-prompts", "8", "--plot", "p.png"])
    assert args.concurrency == [1, 4] and args.num_prompts == 8 and args.plot == "p.png"
    assert parse(["bench", "serve"]).concurrency == [1, 8, 32]


@pytest.mark.parametrize("bad", ["", "0,8", "1,x", "-2"])
def test_bad_concurrency_is_rejected(bad):
    with pytest.raises(argparse.ArgumentTypeError, match="concurrency"):
        concurrency_list(bad)
    with pytest.raises(SystemExit):
        parse(["bench", "serve", "--concurrency", bad])


@pytest.mark.parametrize("bad", [["--num-prompts", "0"], ["--input-len", "-1"]])
def test_non_positive_sizes_are_rejected(bad):
    with pytest.raises(SystemExit):
        parse(["bench", "throughput", *bad])


def test_bench_needs_a_mode():
    with pytest.raises(SystemExit):
        parse(["bench"])


@pytest.mark.parametrize("values", [[3.0], [5.0, 1.0], [0.1, 0.4, 0.2, 9.0, 3.3, 3.3, 7.5]])
@pytest.mark.parametrize("q", [0, 50, 90, 99, 100])
def test_percentile_matches_numpy(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edges():
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="q must be in"):
        percentile([1.0], 101)


def test_random_prompts_are_seeded_sized_and_skip_excluded_ids():
    a = random_prompts(3, 50, vocab_size=10, seed=7, exclude=[0, 1, 2])
    assert a == random_prompts(3, 50, vocab_size=10, seed=7, exclude=[0, 1, 2])
    assert a != random_prompts(3, 50, vocab_size=10, seed=8, exclude=[0, 1, 2])
    assert [len(p) for p in a] == [50, 50, 50]
    assert {t for p in a for t in p} <= set(range(3, 10))
    with pytest.raises(ValueError, match="no token ids left"):
        random_prompts(1, 1, vocab_size=2, seed=0, exclude=[0, 1])


def test_summarize_level_rates_and_percentiles():
    records = [
        RequestRecord(ttft=0.1, itls=[0.01, 0.03], latency=0.5, output_tokens=10, prompt_tokens=4),
        RequestRecord(ttft=0.3, itls=[0.02], latency=0.7, output_tokens=20, prompt_tokens=6),
        RequestRecord(error="HTTP 503: overloaded"),
    ]
    r = summarize_level(8, records, duration_s=2.0)
    assert (r.concurrency, r.num_requests, r.num_failed) == (8, 3, 1)
    assert (r.output_tokens, r.prompt_tokens) == (30, 10)
    assert r.output_tok_s == pytest.approx(15.0) and r.total_tok_s == pytest.approx(20.0) and r.request_s == 1.0
    assert r.ttft_ms["p50"] == pytest.approx(200.0) and r.ttft_ms["mean"] == pytest.approx(200.0)
    assert r.itl_ms["p50"] == pytest.approx(20.0) and r.itl_ms["p99"] == pytest.approx(
        float(np.percentile([10, 30, 20], 99))
    )
    assert r.errors == ["HTTP 503: overloaded"]


def test_summary_of_only_failures_has_no_latencies():
    r = summarize_level(1, [RequestRecord(error="boom")], duration_s=1.0)
    assert r.output_tok_s == 0 and math.isnan(r.ttft_ms["p50"]) and r.num_failed == 1


def test_table_and_json(tmp_path):
    text = format_table(["A", "LONGER"], [[1, "x"], ["wide-cell", 2]])
    lines = text.splitlines()
    assert lines[0].split() == ["A", "LONGER"] and set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].index("x") == lines[0].index("LONGER") == len("wide-cell") + 2
    write_json(tmp_path / "r.json", {"a": math.nan, "b": [1.5, math.nan]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"a": None, "b": [1.5, None]}


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from core.bench.report import plot_levels

    levels = [summarize_level(c, [RequestRecord(ttft=0.1 * c, latency=1.0, output_tokens=5 * c)], 1.0) for c in (1, 8)]
    plot_levels(levels, tmp_path / "p.png", title="t")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tiny_throughput_end_to_end(tmp_path, capsys):
    """A few prompts through the real engine on a tiny random Llama (reference kernels or a plugin)."""
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64, bos_token_id=1, eos_token_id=2)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    out = tmp_path / "tp.json"
    args = parse(["bench", "throughput", str(tmp_path / "tiny"), "--skip-tokenizer-init", "--num-prompts", "3",
                  "--input-len", "5", "--output-len", "4", "--dtype", "float32", "--kv-cache-memory", "0.01",
                  "--json", str(out)])  # fmt: skip
    assert args.func(args) == 0
    result = json.loads(out.read_text())["result"]
    assert (result["num_prompts"], result["prompt_tokens"], result["output_tokens"]) == (3, 15, 12)
    assert result["output_tok_s"] > 0 and result["elapsed_s"] > 0
    assert "OUTPUT tok/s" in capsys.readouterr().out
