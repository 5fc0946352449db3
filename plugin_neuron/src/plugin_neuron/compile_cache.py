"""Where the Neuron compiler caches graphs and where vLLM's Neuron backend keeps the
compiled model (pure functions of the environment).

The Neuron persistent cache (AWS Neuron docs, "Neuron Persistent Cache"): compiled
graphs go to ``/var/tmp/neuron-compile-cache`` by default; ``--cache_dir=<url>`` in
``NEURON_CC_FLAGS`` or ``NEURON_COMPILE_CACHE_URL=<url>`` moves it, and "the cache URL
specified using --cache_dir is prioritized over that specified using
NEURON_COMPILE_CACHE_URL if both are set"; an ``s3://`` URL puts it in an S3 bucket;
``--no_cache`` in ``NEURON_CC_FLAGS`` disables it. This plugin's own setting
(``CORE_NEURON_COMPILE_CACHE_URL``) is exported as ``NEURON_COMPILE_CACHE_URL`` when
that is unset, so it ranks last.

The compiled model (vLLM's NxD Inference guide): ``NEURON_COMPILED_ARTIFACTS`` names
the directory of a pre-compiled model; unset, the model is compiled into a
``neuron-compiled-artifacts`` subdirectory of the model checkpoint's directory (here
one more level, named by a hash of what was compiled, so that two configurations do
not overwrite each other).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CACHE_DIR = "/var/tmp/neuron-compile-cache"
ARTIFACTS_SUBDIR = "neuron-compiled-artifacts"


@dataclass(frozen=True)
class CompileCache:
    """The cache the compiler will use: ``url`` None when disabled; ``source`` is the
    setting that decided it; ``shadowed`` names settings it overrode."""

    url: str | None
    source: str
    shadowed: list[str] = field(default_factory=list)

    @property
    def is_s3(self) -> bool:
        return self.url is not None and self.url.startswith("s3://")


def check_cache_url(url: str, name: str) -> str:
    """A local directory or ``s3://bucket[/prefix]``, else ValueError naming ``name``."""
    if url.startswith("s3://"):
        if not url[len("s3://") :].split("/")[0]:
            raise ValueError(f"{name}={url!r} names no S3 bucket: expected s3://<bucket>[/<prefix>]")
        return url
    if "://" in url or not url.strip():
        raise ValueError(f"{name}={url!r}: the Neuron compile cache is a local directory or an s3:// URL")
    return url


def cache_dir_flag(cc_flags: str) -> str | None:
    """The ``--cache_dir`` value of ``NEURON_CC_FLAGS`` (``--cache_dir=X`` or ``--cache_dir X``)."""
    words = shlex.split(cc_flags)
    for index, word in enumerate(words):
        if word.startswith("--cache_dir="):
            return word.split("=", 1)[1]
        if word == "--cache_dir" and index + 1 < len(words):
            return words[index + 1]
    return None


def resolve_compile_cache(environ: Mapping[str, str], configured: str | None) -> CompileCache:
    """The compile cache under ``environ`` and this plugin's ``configured`` URL, by the
    documented precedence: ``--no_cache``, ``--cache_dir``, ``NEURON_COMPILE_CACHE_URL``,
    the plugin's setting, the default directory.

    :raises ValueError: a URL that is neither a local directory nor ``s3://bucket...``.
    """
    flags = environ.get("NEURON_CC_FLAGS", "")
    candidates = [
        ("NEURON_CC_FLAGS --cache_dir", cache_dir_flag(flags)),
        ("NEURON_COMPILE_CACHE_URL", environ.get("NEURON_COMPILE_CACHE_URL")),
        ("CORE_NEURON_COMPILE_CACHE_URL", configured),
    ]
    given = [(name, check_cache_url(url, name)) for name, url in candidates if url is not None]
    if "--no_cache" in shlex.split(flags):
        return CompileCache(None, "NEURON_CC_FLAGS --no_cache", [name for name, _ in given])
    if not given:
        return CompileCache(DEFAULT_CACHE_DIR, "default")
    (source, url), rest = given[0], given[1:]
    return CompileCache(url, source, [name for name, other in rest if other != url])


def exports(cache: CompileCache) -> dict[str, str]:
    """Variables to set for the Neuron SDK: the plugin's URL as ``NEURON_COMPILE_CACHE_URL``
    when it is the one in effect (the SDK reads only its own names)."""
    if cache.source == "CORE_NEURON_COMPILE_CACHE_URL":  # so NEURON_COMPILE_CACHE_URL is unset
        return {"NEURON_COMPILE_CACHE_URL": cache.url}
    return {}


def compile_key(settings: Mapping[str, Any]) -> str:
    """A short stable hash of what a compiled model depends on (the shapes, dtype, parallelism)."""
    text = json.dumps(dict(settings), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def compiled_artifacts_dir(model: str, configured: str | None, key: str) -> str:
    """Where the compiled model is loaded from or saved to.

    :param model: the model checkpoint: a directory, or a file whose directory is used.
    :param configured: ``NEURON_COMPILED_ARTIFACTS``, which wins when set.
    :raises ValueError: a model that is not on the local disk and no ``NEURON_COMPILED_ARTIFACTS``.
    """
    if configured:
        return configured
    if not os.path.exists(model):
        raise ValueError(f"model {model!r} is not a local path: set NEURON_COMPILED_ARTIFACTS to a directory")
    base = model if os.path.isdir(model) else os.path.dirname(os.path.abspath(model))
    return os.path.join(base, ARTIFACTS_SUBDIR, key)
