""":class:`PlatformConformance` (contract): the kit's checks in one class a backend's tests inherit."""

from __future__ import annotations

from plugins.testing.edge_checks import EdgeInputChecks
from plugins.testing.identity import IdentityChecks
from plugins.testing.kernel_checks import KernelChecks
from plugins.testing.kv_dtypes import KvCacheDtypeChecks
from plugins.testing.lora_checks import LoRAChecks
from plugins.testing.moe_checks import MoEChecks
from plugins.testing.pooling_checks import PoolingChecks
from plugins.testing.runner_steps import RunnerStepChecks
from plugins.testing.runtime import RuntimeChecks


class PlatformConformance(
    IdentityChecks,
    KernelChecks,
    EdgeInputChecks,
    KvCacheDtypeChecks,
    LoRAChecks,
    MoEChecks,
    PoolingChecks,
    RuntimeChecks,
    RunnerStepChecks,
):
    """Inherit this in a backend's tests and set :attr:`platform` to its Platform class."""
