"""Groups: new_group, global-rank translation, non-members, destroy, timeouts."""

import datetime
import warnings

import numpy as np
import pytest

import distcomm as dist


def test_world_group(rank, size):
    w = dist.group.WORLD
    assert w is dist.GroupMember.WORLD and isinstance(w, dist.ProcessGroup)
    assert w.rank() == rank and w.size() == size
    assert dist.get_rank(w) == rank and dist.get_world_size(w) == size
    assert dist.get_backend() == dist.get_backend(w) in ("shm", "socket")
    assert dist.get_process_group_ranks(w) == list(range(size))
    assert dist.is_initialized() and dist.is_available()
    x = np.ones(2)
    dist.all_reduce(x, group=w)
    assert np.all(x == size)


def test_even_ranks_group(rank, size):
    evens = list(range(0, size, 2))
    g = dist.new_group(evens)
    if rank % 2 == 0:
        assert isinstance(g, dist.ProcessGroup)
        assert dist.get_rank(g) == rank // 2
        assert dist.get_world_size(g) == len(evens)
        assert dist.get_process_group_ranks(g) == evens
        assert dist.get_global_rank(g, len(evens) - 1) == evens[-1]
        assert dist.get_group_rank(g, rank) == rank // 2
        x = np.array([rank], np.int64)
        dist.all_reduce(x, group=g)
        assert x[0] == sum(evens)
        y = np.array([rank], np.int64)
        dist.broadcast(y, src=evens[-1], group=g)  # src is a global rank
        assert y[0] == evens[-1]
        out = [np.zeros(1, np.int64) for _ in evens]
        dist.all_gather(out, np.array([rank], np.int64), group=g)
        assert [o[0] for o in out] == evens
    else:
        assert g is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(g) == -1 and dist.get_world_size(g) == -1
        x = np.array([rank], np.int64)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert dist.all_reduce(x, group=g) is None  # not a member: nothing happens
        assert x[0] == rank and caught and issubclass(caught[0].category, RuntimeWarning)
    dist.destroy_process_group(g)


def test_unsorted_ranks_are_sorted_like_torch(rank, size):
    ranks = list(reversed(range(size)))
    g = dist.new_group(ranks)
    assert g.rank() == rank and g.ranks == list(range(size))
    dist.destroy_process_group(g)


def test_subgroup_collectives_with_roots(rank, size):
    members = list(range(1, size)) if size > 2 else [1]
    g = dist.new_group(members)
    if rank in members:
        n = len(members)
        root = members[-1]
        x = np.array([rank + 1], np.int32)
        dist.reduce(x, dst=root, group=g)
        if rank == root:
            assert x[0] == sum(m + 1 for m in members)
        gl = [np.zeros(1, np.int32) for _ in range(n)] if rank == root else None
        dist.gather(np.array([rank], np.int32), gl, dst=root, group=g)
        if rank == root:
            assert [v[0] for v in gl] == members
        out = np.zeros(1, np.int32)
        sl = [np.array([m * 3], np.int32) for m in members] if rank == root else None
        dist.scatter(out, sl, src=root, group=g)
        assert out[0] == rank * 3
        dist.barrier(group=g)
        objs = [None] * n
        dist.all_gather_object(objs, rank, group=g)
        assert objs == members
    dist.destroy_process_group(g)


def test_overlapping_groups(rank, size):
    a = dist.new_group([0, 1])
    b = dist.new_group(list(range(1, size)))
    for _ in range(3):
        if rank in (0, 1):
            x = np.ones(1)
            dist.all_reduce(x, group=a)
            assert x[0] == 2
        if rank >= 1:
            y = np.ones(1)
            dist.all_reduce(y, group=b)
            assert y[0] == size - 1
    dist.destroy_process_group(b)
    dist.destroy_process_group(a)


def test_group_timeout_and_async(rank, size):
    g = dist.new_group(timeout=datetime.timedelta(seconds=30))
    x = np.full(3, rank, np.float64)
    w = dist.all_reduce(x, group=g, async_op=True)
    w.wait()
    assert np.all(x == size * (size - 1) / 2)
    dist.destroy_process_group(g)


def test_destroyed_group_is_refused(rank, size):
    g = dist.new_group()
    dist.destroy_process_group(g)
    with pytest.raises(dist.DistInvalidUsage, match="destroyed"):
        dist.all_reduce(np.ones(1), group=g)


def test_rank_not_in_group(rank, size):
    g = dist.new_group([0, 1])
    if rank in (0, 1):
        outside = 2 if size > 2 else None
        if outside is not None:
            with pytest.raises(dist.DistInvalidArgument, match="not a member"):
                dist.broadcast(np.ones(1), src=outside, group=g)
        with pytest.raises(dist.DistInvalidArgument, match="outside"):
            dist.broadcast(np.ones(1), src=size, group=g)
    dist.destroy_process_group(g)


def test_bad_new_group_arguments(rank, size):
    for bad in ([size], [-1], [0, 0], [], ["0"], 3):
        with pytest.raises(dist.DistInvalidArgument):
            dist.new_group(bad)
