"""The Ray executor reserves the resource the platform names for each rank, never a device of its own choice."""

import pytest
from core.distributed.ray_executor import rank_resources
from plugins.reference import ReferencePlatform


@pytest.mark.parametrize(
    "key,options",
    [
        ("CPU", {"num_cpus": 1}),
        ("GPU", {"num_cpus": 0, "num_gpus": 1}),
        ("TPU", {"num_cpus": 0, "resources": {"TPU": 1}}),
        ("neuron_cores", {"num_cpus": 0, "resources": {"neuron_cores": 1}}),
    ],
)
def test_a_rank_reserves_one_unit_of_the_platforms_key(key, options):
    assert rank_resources(key) == options


def test_the_default_key_is_a_cpu():
    assert ReferencePlatform.ray_device_key == "CPU"
