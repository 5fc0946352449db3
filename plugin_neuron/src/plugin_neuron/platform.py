"""The AWS Neuron backend: torch_neuronx installed and a Neuron device (/dev/neuron*).

Tensors live on torch's ``"neuron"`` device (the Neuron PyTorch backend). Graphs are
compiled ahead of time for the shapes of :class:`plugin_neuron.buckets.NeuronShapes`;
compiled graphs go to the Neuron compile cache and the compiled model to its artifacts
directory (:mod:`plugin_neuron.compile_cache`). The SDK (torch_neuronx and the
framework, NxD Inference or transformers-neuronx) is imported only in
:meth:`NeuronPlatform.init_device`.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from typing import Any

import plugins
from plugins import EnvConfigError, EnvVar
from plugins.env import parse_int_list

from plugin_neuron.buckets import NeuronShapes, check_buckets, default_buckets
from plugin_neuron.compile_cache import (
    CompileCache,
    compile_key,
    compiled_artifacts_dir,
    exports,
    resolve_compile_cache,
)

logger = logging.getLogger(__name__)

FRAMEWORKS = {"neuronx-distributed-inference": "neuronx_distributed_inference", "transformers-neuronx": "transformers_neuronx"}  # fmt: skip
#: variables vLLM and the Neuron SDK read under their bare names: honoured after CORE_/VLLM_
BARE_NAMES = ("NEURON_CONTEXT_LENGTH_BUCKETS", "NEURON_TOKEN_GEN_BUCKETS", "NEURON_COMPILED_ARTIFACTS")


def probe(has_torch_neuronx: bool, devices: list[str]) -> str | None:
    """Why the platform is unavailable, or None."""
    if not has_torch_neuronx:
        return "torch_neuronx is not installed (AWS Neuron SDK)"
    if not devices:
        return "no Neuron device found (/dev/neuron*): not a trn1/trn2/inf2 instance, or the driver is not loaded"
    return None


def choose_framework(requested: str | None, installed: set[str]) -> str:
    """vLLM's rule: ``VLLM_NEURON_FRAMEWORK`` when set, else NxD Inference when it is
    installed, else transformers-neuronx.

    :raises ValueError: the framework asked for (or any) is not installed.
    """
    if requested is None:
        for name in FRAMEWORKS:
            if FRAMEWORKS[name] in installed:
                return name
        raise ValueError(f"neither Neuron framework is installed: pip install {' or '.join(FRAMEWORKS)}")
    if FRAMEWORKS[requested] not in installed:
        raise ValueError(f"NEURON_FRAMEWORK={requested} but {FRAMEWORKS[requested]} is not installed")
    return requested


class NeuronPlatform(plugins.Platform):
    """Trainium / Inferentia NeuronCores through torch-neuronx."""

    name = "neuron"
    device_type = "neuron"
    priority = 80
    api_version = 2
    supported_dtypes = ("bfloat16", "float16")  # the Neuron SDK's inference dtypes
    distributed_backend = "xla"  # collectives run over torch-xla's backend on Neuron
    ray_device_key = "neuron_cores"
    env_vars = (
        EnvVar("NEURON_CONTEXT_LENGTH_BUCKETS", parse_int_list, None, "prompt lengths compiled ahead of time, e.g. 128,512,2048 (default: powers of two from 128, then max_model_len); bare name also read"),
        EnvVar("NEURON_TOKEN_GEN_BUCKETS", parse_int_list, None, "context lengths of token-generation graphs (default as above); bare name also read"),
        EnvVar("NEURON_COMPILE_CACHE_URL", str, None, "compiled-graph cache, a directory or s3:// URL; exported as NEURON_COMPILE_CACHE_URL unless that or --cache_dir in NEURON_CC_FLAGS is set (default /var/tmp/neuron-compile-cache)"),
        EnvVar("NEURON_COMPILED_ARTIFACTS", str, None, "directory of the compiled model (default: neuron-compiled-artifacts/<hash> beside the checkpoint); bare name also read"),
        EnvVar("NEURON_FRAMEWORK", str, None, "neuronx-distributed-inference (default when installed) or transformers-neuronx", tuple(FRAMEWORKS)),
    )  # fmt: skip

    def _devices(self) -> list[str]:
        return sorted(glob.glob("/dev/neuron[0-9]*"))

    def unavailable_reason(self) -> str | None:
        return probe(importlib.util.find_spec("torch_neuronx") is not None, self._devices())

    def device_info(self) -> dict[str, Any]:
        return {"name": "AWS Neuron", "count": len(self._devices()), "devices": self._devices()}

    def setting(self, name: str) -> Any:
        """A declared variable's value; for :data:`BARE_NAMES`, the bare spelling (vLLM's)
        when neither ``CORE_`` nor ``VLLM_`` is set.

        :raises plugins.EnvConfigError: naming the variable whose value is bad.
        """
        value = self.env[name]
        if value is not None or name not in BARE_NAMES or name not in os.environ:
            return value
        var = next(v for v in self.env_vars if v.name == name)
        try:
            return var.type(os.environ[name])
        except ValueError as exc:
            raise EnvConfigError(f"{name}={os.environ[name]!r} is not valid: {exc}") from None

    def length_buckets(self, max_model_len: int) -> tuple[list[int], list[int]]:
        """``(context-encoding buckets, token-generation buckets)`` for ``max_model_len``.

        :raises ValueError: naming the variable whose list is invalid.
        """
        result = []
        for name in ("NEURON_CONTEXT_LENGTH_BUCKETS", "NEURON_TOKEN_GEN_BUCKETS"):
            given = self.setting(name)
            result.append(
                default_buckets(max_model_len) if given is None else check_buckets(given, max_model_len, name)
            )
        return result[0], result[1]

    def shapes(self, config: plugins.EngineConfigView) -> NeuronShapes:
        """The shapes compiled for ``config`` (resolved: ``max_model_len`` set)."""
        context, token_gen = self.length_buckets(config.max_model_len)
        return NeuronShapes(context=context, token_gen=token_gen, batch_size=config.max_num_seqs)

    def compile_cache(self) -> CompileCache:
        """The compile cache the Neuron compiler will use under this environment."""
        return resolve_compile_cache(os.environ, self.env["NEURON_COMPILE_CACHE_URL"])

    def artifacts_dir(self, config: plugins.EngineConfigView) -> str:
        """Where the compiled model of ``config`` is loaded from or saved to."""
        shapes = self.shapes(config)
        key = compile_key({"model": config.model, "dtype": config.dtype, "tp": config.tensor_parallel_size,
                           "batch": shapes.batch_size, "context": shapes.context, "token_gen": shapes.token_gen})  # fmt: skip
        return compiled_artifacts_dir(config.model or "", self.setting("NEURON_COMPILED_ARTIFACTS"), key)

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        if config.dtype == "float32":
            raise ValueError("Neuron runs bfloat16 or float16, got dtype='float32'")
        if config.max_model_len:
            self.length_buckets(config.max_model_len)
        self.compile_cache()
        # NxD Inference through vLLM has no chunked prefill: prompts are encoded whole
        return {"enable_chunked_prefill": False} if config.enable_chunked_prefill else {}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        cache = self.compile_cache()
        for name in cache.shadowed:
            logger.warning("Neuron compile cache: %s is set but %s wins (%s)", name, cache.source, cache.url)
        os.environ.update(exports(cache))
        installed = {m for m in FRAMEWORKS.values() if importlib.util.find_spec(m) is not None}
        framework = choose_framework(self.env["NEURON_FRAMEWORK"], installed)
        import torch_neuronx  # noqa: F401  (registers the Neuron device with torch)

        importlib.import_module(FRAMEWORKS[framework])
        shapes = self.shapes(config)
        # the default model (model None) lives where core finds it: its artifacts need the variable
        has_dir = config.model is not None or self.setting("NEURON_COMPILED_ARTIFACTS") is not None
        artifacts = self.artifacts_dir(config) if has_dir else "unset (default model: set NEURON_COMPILED_ARTIFACTS)"
        logger.info("Neuron (%s): %d graphs, context %s, token generation %s at batch %d; cache %s (%s); model in %s",
                    framework, len(shapes.graphs()), shapes.context, shapes.token_gen, shapes.batch_size,
                    cache.url, cache.source, artifacts)  # fmt: skip

    def make_runner(self):
        from plugin_neuron.runner import NeuronRunner

        return NeuronRunner(self)
