"""Repository-wide pytest fixtures.

Engines built in a test bind the pytest process's threads to CPUs (the CPU platforms'
``CPU_OMP_THREADS_BIND``) and set torch's thread count; without a reset every later test
would run on what the last engine chose (one core, say), slower and order-dependent.
"""

import os

import pytest


@pytest.fixture(autouse=True)
def _restore_cpu_binding():
    """Put the process's CPU affinity and torch's thread count back after each test."""
    affinity = os.sched_getaffinity(0)
    import torch

    threads = torch.get_num_threads()
    yield
    if os.sched_getaffinity(0) != affinity:
        os.sched_setaffinity(0, affinity)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
