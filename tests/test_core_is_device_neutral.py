"""`core/` knows no device: device names and device APIs live in plugins (STYLE.md)."""

import re
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "core" / "src" / "core"
FORBIDDEN = re.compile(
    r"torch\.cuda|\bnccl\b|\bhccl\b|habana|torch_xla|\bxla\b|\bhpu\b|\bmps\b|avx|neon\b|\bamx\b|\bcuda\b", re.I
)


def test_no_device_specific_code_in_core():
    hits = []
    for path in sorted(CORE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if FORBIDDEN.search(line):
                hits.append(f"{path.relative_to(CORE)}:{number}: {line.strip()}")
    assert not hits, "device-specific code in core/:\n" + "\n".join(hits)
