"""Benchmark output: aligned tables, JSON files, and the throughput-vs-concurrency plot."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.bench.stats import LevelResult


def format_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces, with a dashed rule under the header."""
    cells = [[str(x) for x in header]] + [[str(x) for x in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [cells[0], ["-" * w for w in widths], *cells[1:]]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines)


def print_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(format_table(header, rows))


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def level_rows(results: Sequence[LevelResult]) -> list[list[str]]:
    """One table row per concurrency level."""
    return [
        [r.concurrency, f"{r.num_requests - r.num_failed}/{r.num_requests}", f"{r.duration_s:.2f}", f"{r.output_tok_s:.1f}",
         f"{r.total_tok_s:.1f}", _ms(r.ttft_ms["p50"]), _ms(r.ttft_ms["p90"]), _ms(r.ttft_ms["p99"]), _ms(r.itl_ms["p50"]),
         _ms(r.itl_ms["p99"])]
        for r in results
    ]  # fmt: skip


LEVEL_HEADER = [
    "CONC",
    "OK",
    "TIME s",
    "OUT tok/s",
    "TOTAL tok/s",
    "TTFT p50 ms",
    "TTFT p90",
    "TTFT p99",
    "ITL p50 ms",
    "ITL p99",
]


def print_levels(results: Sequence[LevelResult]) -> None:
    """The serving table, then any request errors."""
    print_table(LEVEL_HEADER, level_rows(results))
    for r in results:
        for err in r.errors:
            print(f"concurrency {r.concurrency}: {err}")


def write_json(path: str | Path, data: Any) -> None:
    """Write ``data`` as indented JSON (NaN becomes null)."""
    Path(path).write_text(json.dumps(_no_nan(data), indent=2, default=str) + "\n")


def _no_nan(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_no_nan(v) for v in value]
    return value


def plot_levels(results: Sequence[LevelResult], path: str | Path, title: str) -> None:
    """Save output tok/s (and TTFT p50) against concurrency as a PNG. Needs matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ValueError("--plot needs matplotlib: pip install matplotlib (or the core[bench] extra)") from exc
    levels = [r.concurrency for r in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(levels, [r.output_tok_s for r in results], marker="o", label="output tok/s")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(x) for x in levels])
    ax2 = ax.twinx()
    ax2.plot(levels, [r.ttft_ms["p50"] for r in results], marker="s", color="tab:orange", label="TTFT p50 (ms)")
    ax2.set_ylabel("TTFT p50 (ms)")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize="small")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
