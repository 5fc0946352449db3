"""The conformance kit: every check a backend must pass, as one pytest class.

A backend's test suite subclasses :class:`PlatformConformance` and sets ``platform``::

    from plugins.testing import PlatformConformance
    from my_plugin import MyPlatform

    class TestMyPlatform(PlatformConformance):
        platform = MyPlatform

and inherits every check, one module of this package per concern:

- :mod:`plugins.testing.identity`: the required members, API version, availability
  contract, the ``register_platform`` hook of the installed entry point, the tested copy,
  env-config parsing of good and bad values;
- :mod:`plugins.testing.kernel_checks`: each kernel's signature against the SDK's
  :class:`plugins.kernels.Kernels`, and its results against the torch reference on fresh
  random inputs at several shapes and each supported dtype;
- :mod:`plugins.testing.edge_checks`: each kernel on named edge inputs (all-zero rows, tiny and
  huge scales, an eps that matters, one token, the last position or slot, non-contiguous views);
- :mod:`plugins.testing.kv_dtypes`: KV caches of each declared dtype;
- :mod:`plugins.testing.moe_checks` and :mod:`plugins.testing.pooling_checks`: the MoE and
  pooling (encoder attention) hooks against their references;
- :mod:`plugins.testing.lora_checks`: the LoRA shrink/expand hook over a mixed batch;
- :mod:`plugins.testing.runtime`: memory profiler sanity, runner padding equal to eager,
  the communicator, and end-to-end greedy generation on a tiny random model equal to the
  reference platform's tokens (when ``core`` is installed);
- :mod:`plugins.testing.runner_steps`: the platform's own runner (its fused or compiled forward,
  its KV layout) at its block size over prefill, a prefix-cache hit beside decodes, and decode,
  against the eager torch path (when ``core`` is installed).

Checks that need the device skip, with the platform's reason, where it is unavailable.
What backend and engine tests share besides the kit (the reference platform, a test engine
config, the tiny model) is in :mod:`plugins.reference`; quantized checkpoints for tests are
made by :mod:`plugins.testing.quant`.

This package is also registered as a pytest plugin (entry point ``pytest11``): its
:mod:`~plugins.testing.report` hooks name the tested copy of a platform's package.
"""

from plugins.testing.base import TOLERANCES
from plugins.testing.conformance import PlatformConformance
from plugins.testing.report import pytest_collection_finish, pytest_runtest_makereport

__all__ = ["TOLERANCES", "PlatformConformance", "pytest_collection_finish", "pytest_runtest_makereport"]
