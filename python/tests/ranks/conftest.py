"""Fixtures of the rank-side tests: every rank of a job runs the same pytest session.

These files are run inside a job (python/tests/test_jobs.py starts them), e.g.

    dcrun -n 3 python -m pytest -q -p no:cacheprovider python/tests/ranks/rank_*.py

Every rank runs every test in the same order, so the collectives of a test match up. A test must
make the same collective calls on every rank (or raise on every rank before calling), or the
ranks fall out of step.
"""

import os

import numpy as np
import pytest

import distcomm as dist


def pytest_configure(config):
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        raise pytest.UsageError("rank-side tests run inside a job: dcrun -n N python -m pytest ...")


@pytest.fixture(scope="session", autouse=True)
def world():
    dist.init_process_group()
    yield dist.GroupMember.WORLD
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture
def rank(world) -> int:
    return dist.get_rank()


@pytest.fixture
def size(world) -> int:
    return dist.get_world_size()


@pytest.fixture(autouse=True)
def in_step(world):
    """After every test: the ranks are still in step (nothing stray was sent) and agree on
    how many tests ran."""
    yield
    n = np.array([1], dtype=np.int64)
    dist.all_reduce(n)
    assert n[0] == dist.get_world_size()
