"""Fixtures of the rank-side torch tests (run inside a job by python/tests/test_torch.py):
the default group is distcomm's ("distcomm" backend), and a Gloo group over the same ranks
gives the reference results for the same inputs.

Every rank runs every test in the same order; a test makes the same collective calls on every
rank (or raises on every rank before calling).
"""

import datetime
import os

import pytest
import torch
import torch.distributed as dist

import distcomm.torch  # noqa: F401  (registers the backend)


def pytest_configure(config):
    if "RANK" not in os.environ:
        raise pytest.UsageError("rank-side tests run inside a job (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)")


@pytest.fixture(scope="session", autouse=True)
def world():
    dist.init_process_group("distcomm", timeout=datetime.timedelta(seconds=60))
    gloo = dist.new_group(backend="gloo")
    yield gloo
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture
def gloo(world):
    return world


@pytest.fixture
def rank(world) -> int:
    return dist.get_rank()


@pytest.fixture
def size(world) -> int:
    return dist.get_world_size()


@pytest.fixture(autouse=True)
def in_step(world):
    """After every test the ranks are still in step (nothing stray was sent, a refused call sent
    nothing) and agree on how many tests ran."""
    yield
    n = torch.ones(1, dtype=torch.int64)
    dist.all_reduce(n)
    assert n.item() == dist.get_world_size()
