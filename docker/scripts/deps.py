"""Print the third-party requirements of distribution folders, one per line.

    python3 deps.py DIR [DIR ...]      e.g. deps.py plugins core plugin_cpu_x86

The folders' own distributions are left out (they are built as wheels in a later step), so
an image layer that installs this list stays cached while only the repository's sources change.
"""

import re
import sys
from pathlib import Path

import tomllib


def third_party(dirs: list[str]) -> list[str]:
    """The sorted union of the ``[project] dependencies`` of ``dirs`` that none of them provides."""
    projects = [tomllib.loads(Path(d, "pyproject.toml").read_text())["project"] for d in dirs]
    own = {p["name"].lower() for p in projects}
    reqs = {r for p in projects for r in p.get("dependencies", [])}
    return sorted(r for r in reqs if re.match(r"[A-Za-z0-9._-]+", r).group().lower() not in own)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: deps.py DIR [DIR ...]")
    print("\n".join(third_party(sys.argv[1:])))
