"""The AWS Neuron backend: torch_neuronx installed and a Neuron device (/dev/neuron*).

Tensors live on torch's ``"neuron"`` device (the Neuron PyTorch backend). Graphs are
compiled ahead of time for a fixed batch size and the length buckets of
:mod:`plugin_neuron.buckets`; the compiled artifacts go to the Neuron compile cache.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
from typing import Any

import plugins
from plugins import EnvVar
from plugins.env import parse_int_list

from plugin_neuron.buckets import check_buckets, default_buckets

logger = logging.getLogger(__name__)


def probe(has_torch_neuronx: bool, devices: list[str]) -> str | None:
    """Why the platform is unavailable, or None."""
    if not has_torch_neuronx:
        return "torch_neuronx is not installed (AWS Neuron SDK)"
    if not devices:
        return "no Neuron device found (/dev/neuron*): not a trn1/trn2/inf2 instance, or the driver is not loaded"
    return None


class NeuronPlatform(plugins.Platform):
    """Trainium / Inferentia NeuronCores through torch-neuronx."""

    name = "neuron"
    device_type = "neuron"
    priority = 80
    api_version = 2
    supported_dtypes = ("bfloat16", "float16")  # the Neuron SDK's inference dtypes
    distributed_backend = "xla"  # collectives run over torch-xla's backend on Neuron
    env_vars = (
        EnvVar("NEURON_CONTEXT_LENGTH_BUCKETS", parse_int_list, None, "prompt lengths compiled ahead of time, e.g. 128,512,2048 (default: powers of two to max_model_len)"),
        EnvVar("NEURON_TOKEN_GEN_BUCKETS", parse_int_list, None, "context lengths of token-generation graphs (default: powers of two to max_model_len)"),
        EnvVar("NEURON_COMPILE_CACHE_URL", str, None, "compiled-graph cache (local path or s3:// URL), passed to the Neuron compiler as NEURON_COMPILE_CACHE_URL"),
    )  # fmt: skip

    def _devices(self) -> list[str]:
        return sorted(glob.glob("/dev/neuron[0-9]*"))

    def unavailable_reason(self) -> str | None:
        return probe(importlib.util.find_spec("torch_neuronx") is not None, self._devices())

    def device_info(self) -> dict[str, Any]:
        return {"name": "AWS Neuron", "count": len(self._devices()), "devices": self._devices()}

    def length_buckets(self, max_model_len: int) -> tuple[list[int], list[int]]:
        """``(context-encoding buckets, token-generation buckets)`` for ``max_model_len``.

        :raises ValueError: naming the variable whose list is invalid.
        """
        result = []
        for name in ("NEURON_CONTEXT_LENGTH_BUCKETS", "NEURON_TOKEN_GEN_BUCKETS"):
            given = self.env[name]
            result.append(
                default_buckets(max_model_len) if given is None else check_buckets(given, max_model_len, name)
            )
        return result[0], result[1]

    def check_config(self, config: plugins.EngineConfigView) -> dict[str, Any]:
        if config.dtype == "float32":
            raise ValueError("Neuron runs bfloat16 or float16, got dtype='float32'")
        if config.max_model_len:
            self.length_buckets(config.max_model_len)
        return {}

    def init_device(self, config: plugins.EngineConfigView) -> None:
        cache = self.env["NEURON_COMPILE_CACHE_URL"]
        if cache is not None:
            os.environ.setdefault("NEURON_COMPILE_CACHE_URL", cache)
        import torch_neuronx  # noqa: F401  (registers the Neuron device with torch)

        context, token_gen = self.length_buckets(config.max_model_len)  # resolved by now
        logger.info("Neuron buckets: context %s, token generation %s", context, token_gen)

    def make_runner(self):
        from plugin_neuron.runner import NeuronRunner

        return NeuronRunner(self)
