"""The engine at an earlier commit against this checkout: same workloads, one invocation.

    python bench/before_after.py --base 50ba100       # issue 13's redesign: the commit before it

Checks ``--base`` out as a git worktree in the bench cache, installs it into its own venv
(``scripts/install.sh``, as a user would), then runs ``core bench throughput`` on the
default model with each venv in turn, ``--rounds`` times alternating (so a noisy spell hits
both sides), and reports each workload's median and the ratio after/before in a section of
bench/RESULTS.md. Not for CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from floors import machine_info  # noqa: E402
from llamacpp import cache_dir  # noqa: E402
from results import write_section  # noqa: E402

SECTION = "before-after"
#: name -> (core bench throughput arguments, the rate reported: "output_tok_s" or "total_tok_s")
WORKLOADS = {
    "batch-1 decode (1x16 prompt, 128 generated)": (["--num-prompts", "1", "--input-len", "16", "--output-len", "128"], "output_tok_s"),
    "prefill 4x128 (1 generated)": (["--num-prompts", "4", "--input-len", "128", "--output-len", "1"], "total_tok_s"),
    "prefill 1x512 (1 generated)": (["--num-prompts", "1", "--input-len", "512", "--output-len", "1"], "total_tok_s"),
    "batched 32x(128+128)": (["--num-prompts", "32", "--input-len", "128", "--output-len", "128"], "output_tok_s"),
}  # fmt: skip


def base_venv(rev: str, cache: Path) -> Path:
    """The venv of ``rev`` checked out and installed under ``cache`` (made on first use)."""
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", rev], check=True, capture_output=True, text=True)
    tree = cache / f"base-{sha.stdout.strip()[:12]}"
    venv = tree / ".venv"
    if not (venv / ".installed").exists():
        if not tree.exists():
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True)
        subprocess.run(["scripts/install.sh"], cwd=tree, check=True)
        (venv / ".installed").touch()
    return venv


def run(venv: Path, args: list[str], rate: str, extra: list[str]) -> float:
    """One ``core bench throughput`` run of ``venv``'s engine; its ``rate`` in tok/s."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [str(venv / "bin" / "core"), "bench", "throughput", "--no-enable-prefix-caching", *args, *extra]
        subprocess.run([*cmd, "--json", out.name], check=True, capture_output=True)
        return json.loads(Path(out.name).read_text())["result"][rate]


def render(base: str, rows: dict[str, dict[str, list[float]]], command: str, load: tuple[float, float]) -> str:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    m = machine_info()
    lines = [
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}); before = `{base}`, "
        f"after = `{head.stdout.strip()}`; {m['cpu']} ({m['logical_cpus']} CPUs; {m['flags']}), "
        f"load average {load[0]:.2f} at the start and {load[1]:.2f} at the end; "
        "default model (GGUF Q4_1), default settings, no prefix caching; median of the rounds (tok/s), "
        "rounds alternate before and after.",
        "",
        "| workload | before tok/s | after tok/s | after / before | rounds (before; after) |",
        "|---|---|---|---|---|",
    ]
    for name, sides in rows.items():
        b, a = statistics.median(sides["before"]), statistics.median(sides["after"])
        spread = "; ".join(", ".join(f"{x:.0f}" for x in sides[s]) for s in ("before", "after"))
        lines.append(f"| {name} | {b:.1f} | {a:.1f} | {a / b:.2f}x | {spread} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="git revision to compare with (e.g. the commit before a change)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results", default=str(HERE / "RESULTS.md"), help="'' to print only")
    p.add_argument("extra", nargs="*", help="more `core bench throughput` arguments for both sides (after --)")
    a = p.parse_args(argv)
    venvs = {"before": base_venv(a.base, cache_dir()), "after": Path(sys.prefix)}
    load_start = os.getloadavg()[0]
    rows: dict[str, dict[str, list[float]]] = {name: {"before": [], "after": []} for name in WORKLOADS}
    for r in range(a.rounds):
        for name, (args, rate) in WORKLOADS.items():
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                rows[name][side].append(run(venvs[side], args, rate, a.extra))
                print(f"round {r + 1} {side:6} {name}: {rows[name][side][-1]:.1f} tok/s", flush=True)
    text = render(
        a.base, rows, shlex.join(["python", "bench/before_after.py", *argv]), (load_start, os.getloadavg()[0])
    )
    print(text)
    if a.results:
        write_section(a.results, SECTION, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
